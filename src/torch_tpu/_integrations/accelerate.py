"""HF accelerate learns the tpu device, so that `transformers.Trainer` trains on it unmodified.

accelerate 1.15 does not ask `torch.accelerator`. It picks its device from a fixed chain of
in-tree checks (`PartialState.default_device`: mps, mlu, sdaa, musa, npu, hpu, cuda, xpu,
neuron, else cpu) and its distributed backend from another (`PartialState._prepare_backend`).
Inside Trainer, which already knows tpu and puts the model on tpu:0, accelerate's
`prepare()` then moves the model back to the CPU, and the first step fails with
`DeviceMismatchError ... tpu:0 and cpu (aten::embedding)`.

Its one extension point for a device it does not know is the ACCELERATE_TORCH_DEVICE
environment variable. Setting it by default at `import torch_tpu` was considered and
rejected:
  - it pins the device before anything else is looked at: `PartialState(cpu=True)`, i.e.
    `TrainingArguments(use_cpu=True)` or `accelerate launch --cpu`, would still train on
    tpu (`set_device` returns at once when a device is already set);
  - under torchrun it changes the device only: `_prepare_backend` still finds no backend,
    so every process trains alone (DistributedType.NO: no DDP, no gradient all-reduce);
  - it is inherited by child processes, including those that do not load this package
    (TORCH_DEVICE_BACKEND_AUTOLOAD=0), where `torch.device("tpu")` then raises.

So three methods of `PartialState` are wrapped. Each runs accelerate's own code first and
adds tpu only where accelerate found nothing, so a device accelerate knows (or a future
accelerate that knows tpu) is never overridden, and an explicit ACCELERATE_TORCH_DEVICE
still wins:
  - `default_device`: the CPU fallback becomes tpu when tpu is torch's current accelerator;
  - `_prepare_backend`: launched by torchrun (LOCAL_RANK set, the test accelerate itself
    uses), without cpu, and no in-tree backend matched: backend "tpu_dist" (or the one
    asked for) and DistributedType.MULTI_GPU, accelerate's generic one-process-per-device
    type (DDP wrapping, the FSDP upgrade, wait_for_everyone, broadcasts over the device);
  - `set_device`: for that type the original looks up `torch.cuda`, which would fail
    here; this sets tpu:{local_process_index % device_count()} and `torch.tpu.set_device`,
    as accelerate's generic branch does for its other devices.

The wrappers are installed when `accelerate.state` is first executed (a one-shot finder on
`sys.meta_path`), so `import torch_tpu` imports nothing of accelerate. Written against
accelerate 1.15.0: `SIGNATURES` holds the signatures the wrappers call through; on a
mismatch nothing is patched (with a warning) and tests/test_trainer.py fails.
"""
from __future__ import annotations

import importlib.abc
import inspect
import sys
import warnings

import torch

WRITTEN_AGAINST = "1.15.0"
DEVICE = "tpu"
BACKEND = "tpu_dist"
_MODULE = "accelerate.state"

# str(signature without annotations) of each wrapped PartialState member, in 1.15.0.
SIGNATURES = {
    "default_device": "(self)",
    "_prepare_backend": "(self, cpu=False, sagemaker_dp=False, backend=None)",
    "set_device": "(self)",
}


def signature(member) -> str:
    """A member's signature without annotations (they are strings that move between
    releases without changing the call)."""
    fn = member.fget if isinstance(member, property) else member
    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _tpu_is_the_accelerator() -> bool:
    acc = torch.accelerator.current_accelerator(check_available=True)
    return acc is not None and acc.type == DEVICE


def _patch(state_module) -> None:
    cls = state_module.PartialState
    if getattr(cls, "_tpu_patched", False):
        return
    changed = {n: signature(getattr(cls, n)) for n in SIGNATURES
               if signature(getattr(cls, n)) != SIGNATURES[n]}
    if changed:
        warnings.warn(
            f"torch_tpu: accelerate's PartialState changed since {WRITTEN_AGAINST} ({changed}); "
            "accelerate is left unpatched and may not use the tpu device "
            "(set ACCELERATE_TORCH_DEVICE=tpu for a single process)", RuntimeWarning, stacklevel=2)
        return
    from accelerate.utils import DistributedType
    from accelerate.utils.environment import get_int_from_env

    default_device = cls.default_device.fget
    prepare_backend = cls._prepare_backend
    set_device = cls.set_device

    def _default_device(self) -> torch.device:
        device = default_device(self)
        if device.type == "cpu" and _tpu_is_the_accelerator():
            return torch.device(DEVICE)
        return device

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        found, distributed_type = prepare_backend(self, cpu, sagemaker_dp, backend)
        if (distributed_type == DistributedType.NO and not cpu and not sagemaker_dp
                and get_int_from_env(["LOCAL_RANK"], -1) != -1 and _tpu_is_the_accelerator()):
            return backend or BACKEND, DistributedType.MULTI_GPU
        return found, distributed_type

    def _set_device(self):
        # Only where the original would look up torch.cuda with no CUDA device to find.
        if (self.device is None and self.distributed_type == DistributedType.MULTI_GPU
                and not torch.cuda.is_available() and _tpu_is_the_accelerator()):
            module = getattr(torch, DEVICE)
            self.device = torch.device(DEVICE, self.local_process_index % module.device_count())
            module.set_device(self.device)
            return
        set_device(self)

    for name, fn in (("_prepare_backend", _prepare_backend), ("set_device", _set_device)):
        fn.__wrapped__ = getattr(cls, name)
        fn.__name__ = fn.__qualname__ = name
        setattr(cls, name, fn)
    _default_device.__wrapped__ = default_device
    cls.default_device = property(_default_device, doc=cls.default_device.__doc__)
    cls._tpu_patched = True


class _PatchingLoader(importlib.abc.Loader):
    """accelerate.state's own loader, with the patch applied once its code has run."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ... stay the inner's
        return getattr(self._inner, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)  # one shot: the module is found by the other finders
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    """Patch accelerate now if it is loaded, else as soon as it is."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        if hasattr(module, "PartialState"):
            _patch(module)
        return
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
