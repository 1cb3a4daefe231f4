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

from .. import _config, _patches, metrics
from ..lowering import decomp
from . import fakes, rewrites
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
    fakes.register()


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


def backend(gm, example_inputs, **kwargs):
    """The dynamo backend: a dynamo graph in, a callable on real tensors out."""
    setup_dynamo()
    metrics.count("compile.dynamo_graphs")
    rewrites.check_out_devices(gm)
    rewrites.apply(gm)
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
