"""A `torch.export` program as StableHLO: `to_jax(ep)` returns a `jax.export.Exported`.

    ep = torch.export.export(model.eval(), (x,))
    exp = torch_tpu.export.to_jax(ep)
    exp.mlir_module()                  # StableHLO text
    blob = exp.serialize()             # bytes; in a process without torch:
    jax.export.deserialize(blob).call(x_numpy)

The program is the one torch.compile would run: the graph is decomposed with torch's
default decompositions plus the table the compiled path uses (lowering/decomp.py), then
each node is lowered through the one lowering table (compile/lower.py's GraphLowering),
inside the function that `jax.export` traces. Nothing runs on the device: the program is
traced for abstract inputs of the example inputs' shapes and dtypes.

  arguments   the program's user inputs, flattened in order (torch.export's own order of
              `args` then `kwargs`). By default parameters, buffers and constants are
              embedded as constants of the module; `lift_parameters=True` makes them the
              leading arguments instead, in `ep.graph_signature`'s order
              (`parameter_names(ep)` lists them).
  results     the user outputs, flattened: one array, or a tuple of them. A buffer the
              program updates (BatchNorm's running statistics in training mode) comes
              back after them only with `lift_parameters=True`; embedded, the update is
              dropped, as a served model's would be.
  refusals    ExportError, naming what: an op without a lowering (the same words as
              torch.compile's), random ops (export in eval mode; the stateless program has
              no generator), symbolic (dynamic) dimensions, custom objects.
"""
from __future__ import annotations

import jax
import torch

from . import _runtime
from .compile.lower import GraphLowering, UnsupportedGraph
from .lowering import decomp


class ExportError(RuntimeError):
    """A torch.export program that cannot become StableHLO; the message names why."""


def _decomposed(ep):
    table = torch.export.default_decompositions()
    table.update(decomp.DECOMPOSITIONS)
    return ep.run_decompositions(table)


def _abstract(node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ExportError(f"input {node.name} is a {type(val).__name__}: only tensor inputs "
                          "can be exported")
    if not all(type(s) is int for s in val.shape):
        raise ExportError(f"input {node.name} has symbolic dimensions {tuple(val.shape)}: "
                          "export with static shapes (no dynamic_shapes=)")
    return jax.ShapeDtypeStruct(tuple(val.shape), _runtime.jax_dtype(val.dtype))


def _as_array(t):
    return _runtime.to_device(t.detach().cpu().contiguous()).reshape(tuple(t.shape))


def _state_kinds():
    from torch.export.graph_signature import InputKind

    return (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def to_jax(ep: torch.export.ExportedProgram, *, lift_parameters: bool = False,
           platforms=None) -> jax.export.Exported:
    """`ep` as a `jax.export.Exported` (see the module doc). `platforms` are jax.export's
    lowering platforms (default: the current backend's, e.g. ("cpu",) here)."""
    from torch.export.graph_signature import InputKind, OutputKind

    state_kinds = _state_kinds()
    ep = _decomposed(ep)
    gm, sig = ep.graph_module, ep.graph_signature
    try:
        graph = GraphLowering(gm)
    except UnsupportedGraph as e:
        raise ExportError(f"no lowering for {e}") from None
    if graph.n_seeded:
        ops = sorted({str(n.target) for n in graph.seeded})
        raise ExportError(f"random ops {', '.join(ops)} in the program: export the model in "
                          "eval mode (the exported program has no generator)")
    nodes = {n.name: n for n in graph.placeholders}
    state = {**ep.state_dict, **ep.constants}
    fixed, lifted, user = {}, [], []
    for spec in sig.input_specs:
        node = nodes[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            user.append(node)
        elif spec.kind in state_kinds and lift_parameters:
            lifted.append(node)
        elif spec.kind in state_kinds:
            fixed[node] = _as_array(state[spec.target])
        else:
            raise ExportError(f"input {spec.arg.name} of kind {spec.kind.name} cannot be "
                              "exported")
    outputs = [i for i, s in enumerate(sig.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    updates = [i for i, s in enumerate(sig.output_specs) if s.kind == OutputKind.BUFFER_MUTATION]
    consts = {k: _as_array(v) if isinstance(v, torch.Tensor) else v
              for k, v in graph.consts.items()}

    def program(*args):
        env = dict(fixed)
        env.update(zip(lifted + user, args))
        results = graph.trace(env, consts, 0, 0, lambda i, v: None)
        picked = [results[i] for i in outputs + (updates if lift_parameters else [])]
        return picked[0] if len(picked) == 1 else tuple(picked)

    shapes = [_abstract(n) for n in lifted + user]
    return jax.export.export(jax.jit(program), platforms=platforms)(*shapes)


def parameter_names(ep: torch.export.ExportedProgram) -> list[str]:
    """The names of the leading arguments of `to_jax(ep, lift_parameters=True)`, in order:
    pass `[ep.state_dict | ep.constants][name]` for each (as arrays)."""
    return [s.target for s in ep.graph_signature.input_specs if s.kind in _state_kinds()]
