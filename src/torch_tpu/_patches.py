"""Every patch of torch internals, in one place, each with the torch version it was written
against and the signature of the function it wraps (tests/unit/test_patches.py fails loudly
when an upgrade changes one). After a torch upgrade, this file is the list to check.

Each patch wraps the original and is applied at most once (`apply` is idempotent).
"""
from __future__ import annotations

import importlib
import inspect
import warnings

import torch

from . import _transfer
from .op import current

WRITTEN_FOR = "2.13.0"  # the torch version every patch below was written against


class Patch:
    """`target` ("module:attr.attr") is replaced by `make(original)`."""

    def __init__(self, target: str, signature: str | None, make, why: str):
        self.target = target
        self.signature = signature  # str(inspect.signature(original)); None for a C builtin
        self.make = make
        self.why = why
        self.original = None

    def owner_and_name(self):
        module, _, path = self.target.partition(":")
        *parents, name = path.split(".")
        owner = importlib.import_module(module)
        for p in parents:
            owner = getattr(owner, p)
        return owner, name

    def apply(self) -> None:
        owner, name = self.owner_and_name()
        fn = getattr(owner, name)
        if getattr(fn, "_tpu_patch", None) is self:
            return
        self.original = fn
        new = self.make(fn)
        new._tpu_patch = self
        if isinstance(inspect.getattr_static(owner, name), staticmethod):
            new = staticmethod(new)  # getattr gave the function; keep it unbound
        setattr(owner, name, new)

    def current_signature(self):
        """The signature of the function this patch wraps, as torch has it now."""
        owner, name = self.owner_and_name()
        fn = getattr(owner, name)
        fn = self.original if getattr(fn, "_tpu_patch", None) is self else fn
        try:
            return str(inspect.signature(fn))
        except (TypeError, ValueError):  # a C builtin
            return None


# ---------------------------------------------------------------- printing
def apply_all(patches, consequence: str) -> bool:
    """Apply every patch of a library's set, or none when any wrapped signature changed: a
    warning then names the changes and `consequence` (what the user loses)."""
    changed = {p.target: p.current_signature() for p in patches
               if p.current_signature() != p.signature}
    if changed:
        warnings.warn(f"torch_tpu: {changed} changed since these patches were written; "
                      f"{consequence}", RuntimeWarning, stacklevel=3)
        return False
    for p in patches:
        p.apply()
    return True


def _tensor_str(original):
    def _tensor_str(self, indent):
        if self.device.type == "tpu":
            self = _transfer.to_cpu(self, "print")
        return original(self, indent)
    return _tensor_str


PRINT_FROM_HOST = Patch(
    "torch._tensor_str:_tensor_str", "(self, indent)", _tensor_str,
    "format tpu tensors from a host copy: torch's formatter otherwise runs a dozen small "
    "ops (abs, isfinite, masked_select, ...) on the device, each a compile on first use; "
    "the device suffix (device='tpu:0') is still added by torch from the original tensor")


# ---------------------------------------------------------------- torch.save / pickle
def _write_file(write_file):
    def _write_file(self, *args, **kwargs):
        if self.device.type == "tpu":
            self = self.cpu()
        return write_file(self, *args, **kwargs)
    return _write_file


def _set_from_file(set_from_file):
    def _set_from_file(self, *args, **kwargs):
        if self.device.type != "tpu":
            return set_from_file(self, *args, **kwargs)
        host = torch.UntypedStorage(self.nbytes())
        result = set_from_file(host, *args, **kwargs)
        self.copy_(host)
        return result
    return _set_from_file


_FILE_IO_WHY = (
    "torch.save's legacy writer (also used by pickle) and its reader move a device "
    "storage's bytes through `at::from_blob(storage.data_ptr())`: a second storage at the "
    "same address that does not share our buffer attribute; tpu storages go through a "
    "host copy instead")
WRITE_FILE = Patch("torch:UntypedStorage._write_file", None, _write_file, _FILE_IO_WHY)
SET_FROM_FILE = Patch("torch:UntypedStorage._set_from_file", None, _set_from_file, _FILE_IO_WHY)


# ---------------------------------------------------------------- backward
def _engine_run_backward(run):
    enabled, set_enabled = torch._C._is_multithreading_enabled, torch._C._set_multithreading_enabled

    def _engine_run_backward(*args, **kwargs):
        with current.backward_pass():
            if not enabled():
                return run(*args, **kwargs)
            set_enabled(False)
            try:
                return run(*args, **kwargs)
            finally:
                set_enabled(True)
    return _engine_run_backward


_BACKWARD_WHY = (
    "run backward passes on the thread that calls them, for every caller. By default the "
    "autograd engine hands an accelerator's nodes to one worker thread per device and the "
    "caller waits; for CUDA that thread keeps kernel launches away from the caller, but tpu "
    "ops are asynchronous already, and the hand-off cost ~0.4 ms on a trivial backward and "
    "~1 ms (~15%) of a compiled small-Llama step (measured with and without, interleaved). "
    "`torch.autograd.set_multithreading_enabled(False)` is the engine's own switch; it is "
    "thread-local, so it is set around each backward call (a caller that disabled it is "
    "left alone). The call is also a DeferAndFuse flush point ('backward'): the forward "
    "graph runs on the device while Python records the backward")
# torch.autograd imports the function by name from torch.autograd.graph: both names
BACKWARD_GRAPH = Patch("torch.autograd.graph:_engine_run_backward", (
    "(t_outputs: collections.abc.Sequence[torch.Tensor | torch.autograd.graph.GradientEdge], "
    "*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]"),
                       _engine_run_backward, _BACKWARD_WHY)
BACKWARD_AUTOGRAD = Patch("torch.autograd:_engine_run_backward", BACKWARD_GRAPH.signature,
                          _engine_run_backward, _BACKWARD_WHY)


# ---------------------------------------------------------------- Module.to
def _module_apply(apply):
    def _apply(self, fn, recurse=True):
        try:
            return apply(self, fn, recurse)
        except RuntimeError as e:
            if "Couldn't swap" not in str(e) or not torch.__future__.get_swap_module_params_on_conversion():
                raise
        torch.__future__.set_swap_module_params_on_conversion(False)
        try:
            return apply(self, fn, recurse)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(True)
    return _apply


MODULE_APPLY = Patch(
    "torch.nn:Module._apply", "(self, fn, recurse=True)", _module_apply,
    "Module.to('tpu') swaps parameters (so tied weights stay tied: set in _device). Swapping "
    "needs the parameter held by nobody else; an autograd graph may hold it "
    "(nn.utils.weight_norm keeps `weight` computed from weight_g/weight_v from the start). "
    "There CUDA's `param.data = ...` still works; here the module that refused is "
    "converted again without swapping: its parameters become new Parameter objects, as "
    "torch does for any device pair it cannot shallow-copy")


# ---------------------------------------------------------------- torch.compile's default backend
# (prepare, backend): compile.register() hands them down, this module sitting below compile/
_TPU_COMPILE: list = []
_warned_options: set = set()


def route_default_compile(prepare, backend) -> None:
    """Send torch.compile's default backend (inductor) graphs on tpu tensors to `backend`;
    `prepare()` readies dynamo for tpu when a compile is requested, before dynamo traces."""
    _TPU_COMPILE[:] = [prepare, backend]


def _is_tpu(v) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_is_tpu(x) for x in v)
    return isinstance(v, torch.Tensor) and v.device.type == "tpu"


def _on_tpu(gm, inputs) -> bool:
    """Does a dynamo graph compute on tpu tensors: its inputs, parameters, or any value
    (a factory with device="tpu" in a graph without tensor inputs)?"""
    if any(_is_tpu(x) for x in inputs):
        return True
    if any(_is_tpu(p) for p in gm.parameters()) or any(_is_tpu(b) for b in gm.buffers()):
        return True
    return any(_is_tpu(n.meta.get("example_value")) for n in gm.graph.nodes)


def _inductor_init(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if _TPU_COMPILE:
            _TPU_COMPILE[0]()
    return __init__


# mode="reduce-overhead" (inductor's triton.cudagraphs): one launch per graph call, which
# every graph on tpu is already (docs/CAPTURE.md): nothing to warn about
_KEPT_OPTIONS = {"triton.cudagraphs"}


def _inductor_call(call):
    def __call__(self, model_, inputs_, *, config_patches=None):
        if not (_TPU_COMPILE and _on_tpu(model_, inputs_)):
            return call(self, model_, inputs_, config_patches=config_patches)
        unused = sorted(set({**self.config, **(config_patches or {})}) - _KEPT_OPTIONS)
        if unused and tuple(unused) not in _warned_options:
            _warned_options.add(tuple(unused))
            warnings.warn(f"torch_tpu: torch.compile's mode/options configure inductor; graphs "
                          f"on tpu compile through torch_tpu's XLA backend, which does not read "
                          f"them: {unused}", stacklevel=2)
        return _TPU_COMPILE[1](model_, inputs_)
    return __call__


_DEFAULT_COMPILE_WHY = (
    "`torch.compile(model)` with no backend, as every public training script writes it, works "
    "on tpu tensors: inductor's graphs that compute on tpu go to torch_tpu's backend (the "
    "`tpu` backend: the lowering table -> one XLA program per graph). torch 2.13's inductor "
    "has a Pallas code generator for device type tpu, but it sets the process's jax_enable_x64 "
    "off and clears JAX's caches on every kernel call, and fails on nanoGPT's forward and on "
    "cross_entropy's backward; measured on an MLP training step it was ~20x slower "
    "(docs/COMPILE.md). The wrapper's __init__ readies dynamo for tpu (compile.setup_dynamo) "
    "before dynamo traces anything, as the `tpu` backend's entry point does")
INDUCTOR_INIT = Patch("torch:_TorchCompileInductorWrapper.__init__",
                      "(self, mode, options, dynamic, name=None)", _inductor_init,
                      _DEFAULT_COMPILE_WHY)
INDUCTOR_CALL = Patch("torch:_TorchCompileInductorWrapper.__call__",
                      "(self, model_, inputs_, *, config_patches=None)", _inductor_call,
                      _DEFAULT_COMPILE_WHY)


def _validate_device(original):
    def _validate_device(query, key, value):
        if query.device.type == "tpu":
            return None  # forward and backward: torch's dense math, or compile/flex.py
        return original(query, key, value)
    return _validate_device


FLEX_ATTENTION_DEVICE = Patch(
    "torch.nn.attention.flex_attention:_validate_device",
    "(query: 'Tensor', key: 'Tensor', value: 'Tensor') -> 'None'",
    _validate_device,
    "flex_attention refuses devices outside a fixed list (cuda, cpu, xpu, hpu, mps) before "
    "anything runs. On tpu its eager path runs torch's own dense implementation op by op "
    "(forward and backward, which CPU's path refuses), and compiled graphs lower its "
    "higher-order ops (compile/flex.py); both are tested against CPU's math "
    "(tests/compile/test_flex_attention.py). Only tpu inputs skip the check")


def _set_pg_timeout(original):
    def _set_pg_timeout(timeout, group=None):
        from torch.distributed import distributed_c10d as c10d

        pg = group if group is not None else c10d._get_default_group()
        if not c10d._rank_not_in_group(pg):
            try:  # (a tpu_dist group lists no device types: ask for the backend)
                backend = pg._get_backend(torch.device("tpu"))
            except RuntimeError:
                backend = None
            # tpu's backend: tpu_dist's ProcessGroupTPU (or gloo, staging tpu tensors)
            if callable(getattr(backend, "_set_default_timeout", None)):
                backend._set_default_timeout(timeout)
                if torch.device("cpu") not in pg._device_types:
                    return None  # (the original would warn that only nccl and gloo can)
        return original(timeout, group)
    return _set_pg_timeout


SET_PG_TIMEOUT = Patch(
    "torch.distributed.distributed_c10d:_set_pg_timeout",
    "(timeout: datetime.timedelta, group: torch.distributed.distributed_c10d.ProcessGroup | None = None) -> None",
    _set_pg_timeout,
    "`_set_pg_timeout` (torchtitan sets a short timeout after its first step) looks only for "
    "gloo and NCCL backends among a group's, by device type cpu and cuda, and warns for any "
    "other: a tpu_dist group's timeout is set here, and the original still sets a gloo "
    "backend the group has for cpu")


# ---------------------------------------------------------------- dynamo (applied lazily)
def _set_capturable(original):
    def _set_capturable(self, tx):
        opt = self.value
        for group in opt.param_groups:
            params = group.get("params", [])
            if ("capturable" in group and params
                    and all(isinstance(p, torch.Tensor) and p.device.type == "tpu" for p in params)
                    and all(p not in opt.state for p in params)):
                group["capturable"] = True
        return original(self, tx)
    return _set_capturable


CAPTURABLE_OPTIMIZERS = Patch(
    "torch._dynamo.variables.optimizer:OptimizerVariable._set_capturable", "(self, tx: 'InstructionTranslatorBase') -> None",
    _set_capturable,
    "compiled optimizer steps keep their state on the device, as dynamo arranges for CUDA "
    "and XPU: dynamo sets `capturable=True` on a param group it traces for the first time "
    "only when every param is a CUDA or XPU tensor, and otherwise `_init_group` puts each "
    "`step` counter on the CPU: a host computation per param in the graph, and a transfer "
    "every step")

# ---------------------------------------------------------------- the OpInfo sweep (applied by it)
def _unseeded(wrapper_set_seed):
    def _unseeded(op, *args, **kwargs):
        return op(*args, **kwargs)
    return _unseeded


OPINFO_UNSEEDED = Patch(
    "torch.testing._internal.common_methods_invocations:wrapper_set_seed",
    "(op, *args, **kwargs)", _unseeded,
    "OpInfo wraps random ops in `wrapper_set_seed`, which reseeds with 42 on every call; "
    "the sweep seeds each run itself: it pools CPU's draws over several seeds to estimate "
    "the distribution that tpu's draw is judged against")

AT_IMPORT = [PRINT_FROM_HOST, WRITE_FILE, SET_FROM_FILE, BACKWARD_GRAPH, BACKWARD_AUTOGRAD,
             MODULE_APPLY, INDUCTOR_INIT, INDUCTOR_CALL, FLEX_ATTENTION_DEVICE, SET_PG_TIMEOUT]
WITH_DYNAMO = [CAPTURABLE_OPTIMIZERS]  # importing dynamo costs ~2.5 s: applied by compile
FOR_VALIDATION = [OPINFO_UNSEEDED]  # applied by `python -m torch_tpu validate ops` only
ALL = AT_IMPORT + WITH_DYNAMO + FOR_VALIDATION


def apply_at_import() -> None:
    for p in AT_IMPORT:
        p.apply()


def apply_with_dynamo() -> None:
    for p in WITH_DYNAMO:
        p.apply()


def apply_for_validation() -> None:
    for p in FOR_VALIDATION:
        p.apply()

