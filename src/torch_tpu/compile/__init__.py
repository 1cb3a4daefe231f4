"""The torch.compile backend "tpu": dynamo -> AOTAutograd -> the lowering table -> jax.jit.

`torch.compile(model, backend="tpu")`, and `torch.compile(model)` with no backend: the
default backend (inductor) hands its graphs on tpu tensors to this one (docs/COMPILE.md says
why). Dynamo captures graphs (graph breaks run in the current eager mode); AOTAutograd
functionalizes them and splits forward and backward; each aten graph becomes one
`jax.jit` program (program.Program) whose inputs and outputs are real tpu tensors.
AOTAutograd itself handles what its contract covers outside the graph: outputs that alias
inputs or each other are regenerated as views, and input mutations of training graphs are
applied with copy_. Inference graphs keep their input mutations in the graph
(`keep_inference_input_mutations`), so an optimizer step writes its parameters inside the
one program.

A graph with an op that nothing lowers runs eagerly, node by node in the current eager
mode, with a warning that names the ops (counted as `compile.eager_graphs`).

`dynamic=True` / `mark_dynamic`: sizes reach the graph as int inputs. XLA programs have
static shapes, so each new size compiles one new executable of the same graph (counted
as `compile.respecializations`); dynamo does not recompile.
"""
from __future__ import annotations

import functools
import importlib.metadata
import itertools
import sys
import warnings

import torch

from .. import _config, _patches, metrics
from ..lowering import decomp
from .lower import UnsupportedGraph
from .program import Program

BACKEND_NAME = "tpu"
_counter = itertools.count()
_warned: set = set()


def _boxed(fn):
    fn._boxed_call = True
    return fn


def _compiler(kind: str):
    def compile_graph(gm, example_inputs):
        name = f"{kind}{next(_counter)}"
        try:
            program = Program(gm, example_inputs, name)
        except UnsupportedGraph as e:
            return _eager_graph(gm, str(e))
        if _config.get("TORCH_TPU_COMPILE_AHEAD"):
            program.compile_ahead(example_inputs)
        return _boxed(program)

    compile_graph.__name__ = f"tpu_{kind}_compiler"
    return compile_graph


def _eager_graph(gm, why: str):
    metrics.count("compile.eager_graphs")
    if why not in _warned:
        _warned.add(why)
        warnings.warn(f"torch_tpu compile: no lowering for {why}; this graph runs eagerly, "
                      "op by op", stacklevel=2)

    def run(args):
        out = gm(*args)
        args.clear()
        return out

    return _boxed(run)


@functools.cache
def _aot_backend():
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=decomp.DECOMPOSITIONS,
        # recompute cheap ops in backward rather than save them: fewer outputs to carry
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )


@functools.cache
def setup_dynamo() -> None:
    """What dynamo needs before it traces anything for tpu; idempotent."""
    _skip_runtime_frames()
    _patches.apply_with_dynamo()


def _skip_runtime_frames() -> None:
    """Keep dynamo out of the device runtime. Code between graphs (after a graph break)
    runs eagerly with dynamo's frame hook still installed, and every tpu op there calls
    torch_tpu's Python kernels and JAX: dynamo would try to compile those frames as user
    code (and fail inside JAX). torch's own runtime files are on dynamo's skip list;
    these are the equivalent for this device. bench/ stays traceable: its models (the
    nanoGPT GPT) are user code that the benchmarks compile."""
    import pkgutil

    from torch._dynamo import trace_rules

    for name in ("jax", "jaxlib", "ml_dtypes"):
        trace_rules.add(name)
    package = sys.modules[__name__.rpartition(".")[0]]
    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "bench":
            trace_rules.add(f"{package.__name__}.{module.name}")


def _check_out_devices(gm) -> None:
    """An out= on another device than the op's tpu inputs is refused, as eager refuses it.
    AOTAutograd would not: it functionalizes `op(..., out=o)` into the op and a copy into
    `o`, and a copy may cross devices (torch's fake kernels check the out's device for
    some ops only: slice_scatter's, for one, does not)."""
    def device(a):
        v = getattr(a, "meta", {}).get("example_value")
        return v.device if isinstance(v, torch.Tensor) else None

    for node in gm.graph.nodes:
        out = node.kwargs.get("out") if node.op == "call_function" else None
        if out is None:
            continue
        ins = [device(a) for a in (*node.args, *(v for k, v in node.kwargs.items() if k != "out"))]
        want = next((d for d in ins if d is not None and d.type == "tpu"), None)
        for o in out if isinstance(out, (list, tuple)) else (out,):
            got = device(o)
            if want is not None and got is not None and got.type != "tpu":
                where = [ln for ln in (node.meta.get("stack_trace") or "").splitlines()
                         if ln.strip().startswith("File ")][-1:]
                raise RuntimeError(f"Expected out tensor to have device {want}, but got {got} "
                                   f"instead ({getattr(node.target, '__name__', node.target)}"
                                   f"{', ' + where[0].strip() if where else ''})")


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
                       eps, *, out=None):
    """torch.native_batch_norm(..., out=) as torch's decomposition redirects it (to
    _native_batch_norm_legit, whose schema marks the running stats as written), then
    copied into the outs, applied to the dynamo graph, above AOTAutograd's
    functionalization: from the decomposition table, below it, AOTAutograd found the
    mutating op in its functional graph and refused the graph."""
    from torch._decomp.decompositions import native_batch_norm_decomposition
    from torch._prims_common.wrappers import _maybe_resize_out, _safe_copy_out

    res = native_batch_norm_decomposition(input, weight, bias, running_mean, running_var,
                                          training, momentum, eps)
    if out is None:
        return res
    for o, r in zip(out, res):
        _maybe_resize_out(o, r.shape)
        _safe_copy_out(copy_from=r, copy_to=o, exact_dtype=False)
    return out


def _unreduced_as_eager(loss_fn):
    """multi_margin_loss with one sample's (a (C,) input's) unreduced loss 0-dim, as eager
    gives it: torch's meta kernel, which dynamo traces with, makes it (1,) on every
    backend (inductor on CUDA too)."""
    import inspect

    signature = inspect.signature(loss_fn)

    def call(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        reduction = (a["reduction"] if a["size_average"] is None and a["reduce"] is None else
                     torch.nn.functional._Reduction.legacy_get_string(a["size_average"], a["reduce"]))
        return out.reshape(()) if reduction == "none" and a["input"].dim() <= 1 else out

    return call


def _multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """F.multilabel_margin_loss in ops AOTAutograd traces as they are. torch's own
    decomposition, which tracing applies at the Autograd key on every backend, counts the
    target slots after the first -1 as class 0 (CPU under aot_eager: 1.60 for eager's
    1.00), and gives one sample's unreduced loss the shape (1,)."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn.functional._Reduction.legacy_get_string(size_average, reduce)
    torch._check(input.dim() <= 2 and input.shape[-1:] != (0,), lambda: (
        f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
        f"{input.shape}"))
    torch._check(target.shape == input.shape, lambda: (
        f"inconsistent target size: {target.shape} for input of size: {input.shape}"))
    x, y = torch.atleast_2d(input), torch.atleast_2d(target)
    c = x.shape[-1]
    idx = torch.arange(c, device=y.device)
    used = idx < torch.where(y == -1, idx, c).amin(-1, keepdim=True)  # slots before the -1
    is_target = (idx == torch.where(used, y, -1).unsqueeze(-1)).any(1)   # (N, C)
    picked = x.gather(-1, torch.where(used, y, 0))                      # x at each slot
    margins = (1 - picked.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / c  # (N, slot, C)
    per = (margins * used.unsqueeze(-1) * ~is_target.unsqueeze(1)).sum((1, 2))
    if reduction == "mean":
        return per.mean()
    if reduction == "sum":
        return per.sum()
    return per.reshape(()) if input.dim() <= 1 else per


# calls that must change before AOTAutograd sees them: the out= forms of _OUT_REWRITES,
# every call of _REWRITES
_OUT_REWRITES = {torch.native_batch_norm: _native_batch_norm,
                 torch.ops.aten.native_batch_norm.out: _native_batch_norm}
_REWRITES = {torch.nn.functional.multi_margin_loss:
             _unreduced_as_eager(torch.nn.functional.multi_margin_loss),
             torch.nn.functional.multilabel_margin_loss: _multilabel_margin_loss}


def _rewrite(gm) -> None:
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        new = _REWRITES.get(node.target) or ("out" in node.kwargs and _OUT_REWRITES.get(node.target))
        if new:
            node.target = new
            changed = True
    if changed:
        gm.recompile()


def backend(gm, example_inputs, **kwargs):
    """The dynamo backend: a dynamo graph in, a callable on real tensors out."""
    setup_dynamo()
    metrics.count("compile.dynamo_graphs")
    _check_out_devices(gm)
    _rewrite(gm)
    if not _config.get("TORCH_TPU_COMPILE_AHEAD"):
        return _aot_backend()(gm, example_inputs, **kwargs)
    from torch._functorch import config

    # AOTAutograd hands over the backward graph now, not at the first backward, so that
    # its XLA compile can start now (Program.compile_ahead)
    with config.patch(force_non_lazy_backward_lowering=True):
        return _aot_backend()(gm, example_inputs, **kwargs)


def _has_entry_point() -> bool:
    try:
        eps = importlib.metadata.distribution("torch_tpu").entry_points
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(ep.group == "torch_dynamo_backends" and ep.name == BACKEND_NAME for ep in eps)


def register() -> None:
    """Make backend="tpu" known to torch.compile. With the package's entry point installed
    (`torch_dynamo_backends: tpu = torch_tpu.compile._entry:backend`) torch finds it
    lazily, and importing torch_tpu does not import dynamo (~2.5 s); otherwise, or when
    dynamo is already imported, register now. torch.compile's default backend sends its
    graphs on tpu tensors here too (_patches.INDUCTOR_CALL; docs/COMPILE.md)."""
    _patches.route_default_compile(setup_dynamo, backend)
    if "torch._dynamo" in sys.modules or not _has_entry_point():
        from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

        if _COMPILER_FNS.get(BACKEND_NAME) is not backend:
            register_backend(compiler_fn=backend, name=BACKEND_NAME)
        setup_dynamo()


__all__ = ["backend", "register", "setup_dynamo", "BACKEND_NAME"]
