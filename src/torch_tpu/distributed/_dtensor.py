"""DTensor sharding strategies for the attention ops that tpu runs.

On tpu, `F.scaled_dot_product_attention` runs torch's "overrideable" fused op, one op each
way (csrc/dispatch.cpp `sdp_choice`, lowering/attention.py). torch's DTensor registers
sharding strategies only for the flash, efficient and cudnn variants, so SDPA on DTensors
(a tensor-parallel plan that keeps DTensors through attention, FSDP2 + TP) raised
"_scaled_dot_product_fused_attention_overrideable.default does not have a sharding
strategy registered". The strategies here are the ones torch gives the flash variant, on
each mesh dimension: replicate everything, shard the heads (tensor parallel), or shard the
batch. The overrideable op also takes a mask and grouped-query heads, so:
- the mask is sharded with q along a dimension it has, and replicated along one it
  broadcasts over; its gradient is then a Partial sum over the ranks' heads (or batch);
- with fewer key/value heads than query heads, heads are sharded only where the kv heads
  split evenly, so each rank's query heads find their own kv head.

DTensor also assumes a local result is laid out in memory as torch's meta kernel lays out
the global one (it views the local tensor by the meta strides): tpu results take their
meta kernel's layout as CPU's do (op/opcall.py), so HF Llama's `.transpose(1, 2)
.reshape(B, S, -1)` after SDPA is a valid view of the local tensor too.

Registration is lazy: `import torch` loads this package, and importing
torch.distributed.tensor costs about 2 s, so the strategies go in when the user's code
first imports it (`_on_import.when_imported`), or at once if it already has.

The calls into DTensor are private API, written against torch 2.13.0. `check_internals()`
compares them with the installed torch: on a mismatch registration warns and does nothing
(SDPA on DTensors then fails with torch's own error, not a wrong answer), and
tests/distributed/test_dtensor_attention.py fails.
"""
from __future__ import annotations

import importlib
import importlib.abc
import inspect
import warnings

import torch

from .. import _on_import

aten = torch.ops.aten
_PACKAGE = "torch.distributed.tensor"
FORWARD = aten._scaled_dot_product_fused_attention_overrideable.default
BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default

# What this module uses of DTensor's private API, as torch 2.13.0 has it:
# (module, attribute, leading positional parameters we pass, keyword parameters we pass).
_INTERNALS = (
    ("torch.distributed.tensor._ops.utils", "expand_to_full_mesh_op_strategy",
     ("mesh", "op_schema", "single_mesh_dim_strategies"), ("input_index", "is_valid_strategy_cb")),
    ("torch.distributed.tensor._op_schema", "OpSchema.get_mesh_from_args",
     ("self",), ("validate",)),
    ("torch.distributed.tensor._sharding_prop", "ShardingPropagator.register_op_strategy",
     ("self", "op_overload", "strategy_func", "schema_info"), ()),
    ("torch.distributed.tensor._op_schema", "OpSchema.args_schema", None, None),
    ("torch.distributed.tensor._op_schema", "OpStrategy.shape", None, None),
    ("torch.distributed.tensor._op_schema", "OpStrategy.tensor_meta", None, None),
    ("torch.distributed.tensor._api", "DTensor._op_dispatcher", None, None),
)

# The forward's outputs, in schema order, that DTensor wraps: out, logsumexp, then
# cum_seq_q, cum_seq_k, max_q, max_k (None or sizes: no placement), philox seed and
# offset (0-dim, replicated), debug_attn_mask (never returned: None).
_FORWARD_OUTPUTS = 9
# Backward arguments that are per-head activations: grad_out, q, k, v, out, logsumexp;
# the mask is argument 4; the other tensors (cum_seq_*, philox seed/offset) replicate.
_BACKWARD_ACTIVATIONS = (0, 1, 2, 3, 6, 7)
_BACKWARD_MASK = 4

_state = {"registered": False}


def _resolve(module_name: str, attribute: str):
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        if isinstance(obj, type) and part in getattr(obj, "__dataclass_fields__", {}):
            return obj.__dataclass_fields__[part]
        obj = getattr(obj, part)
    return obj


def check_internals() -> list[str]:
    """What differs between the DTensor internals this module calls and the installed
    torch's (empty when everything matches torch 2.13.0's)."""
    problems = []
    for module_name, attribute, positional, keywords in _INTERNALS:
        where = f"{module_name}.{attribute}"
        try:
            obj = _resolve(module_name, attribute)
        except (ImportError, AttributeError) as e:
            problems.append(f"{where}: missing ({e})")
            continue
        if positional is None:
            continue
        params = list(inspect.signature(obj).parameters.values())
        names = [p.name for p in params]
        if tuple(names[:len(positional)]) != positional:
            problems.append(f"{where}: positional parameters {names[:len(positional)]}, "
                            f"expected {list(positional)}")
        missing = [k for k in keywords if k not in names]
        if missing:
            problems.append(f"{where}: no parameter {missing}")
    return problems


def _mask_placement(mask, q, dim):
    """The mask's placement when q is sharded on `dim` (None: replicated): sharded along
    the same dimension if it has it (masks are right-aligned to q's 4 dims), replicated
    where it broadcasts."""
    from torch.distributed.tensor import Replicate, Shard

    if dim is None:
        return Replicate()
    mdim = dim - (len(q.shape) - len(mask.shape))
    if mdim >= 0 and mask.shape[mdim] == q.shape[dim]:
        return Shard(mdim)
    return Replicate()


def _mask_grad_placement(mask, q_dim, placement):
    """A float mask's gradient sums over what the mask broadcast: where each rank saw
    only its share of q's heads (or batch), the sum is Partial. A bool mask's is all
    zeros, placed like the mask."""
    from torch.distributed.tensor import Partial, Shard

    if q_dim is None or isinstance(placement, Shard) or mask.tensor_meta.dtype == torch.bool:
        return placement
    return Partial()


def _heads_split_evenly(q_index: int):
    """A filter for grouped-query attention: query head j uses kv head j // (Hq // Hk),
    which stays on the same rank only when the kv heads split evenly."""
    def valid(input_specs, output_specs) -> bool:
        q, k = input_specs[q_index], input_specs[q_index + 1]
        hq, hk = q.shape[1], k.shape[1]
        if hq == hk:
            return True
        shards = 1
        for size, p in zip(k.mesh.shape, k.placements):
            if p.is_shard(1):
                shards *= size
        return hk % shards == 0
    return valid


def _forward_strategy(op_schema):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    args = op_schema.args_schema
    q = args[0]
    mask = args[3] if len(args) > 3 else None
    rows = []
    for dim in (None, 0, 1):  # replicate, batch, heads
        p = Replicate() if dim is None else Shard(dim)
        outputs = [p, p, None, None, None, None, Replicate(), Replicate(), None]
        inputs = [p, p, p] + ([_mask_placement(mask, q, dim)] if mask is not None else [])
        rows.append(outputs + inputs)
    return expand_to_full_mesh_op_strategy(
        op_schema.get_mesh_from_args(), op_schema, rows, input_index=_FORWARD_OUTPUTS,
        is_valid_strategy_cb=_heads_split_evenly(0))


def _backward_strategy(op_schema):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    args = op_schema.args_schema
    q, mask = args[1], args[_BACKWARD_MASK]
    rows = []
    for dim in (None, 0, 1):  # replicate, batch, heads
        p = Replicate() if dim is None else Shard(dim)
        mp = _mask_placement(mask, q, dim) if mask is not None else None
        outputs = [p, p, p, _mask_grad_placement(mask, dim, mp) if mask is not None else None]
        inputs = [p if i in _BACKWARD_ACTIVATIONS else mp if i == _BACKWARD_MASK
                  else Replicate()
                  for i, a in enumerate(args) if isinstance(a, OpStrategy)]
        rows.append(outputs + inputs)
    # the forward has checked the meshes already
    return expand_to_full_mesh_op_strategy(
        op_schema.get_mesh_from_args(validate=False), op_schema, rows, input_index=4,
        is_valid_strategy_cb=_heads_split_evenly(1))


def register() -> bool:
    """Register the strategies and the layout step with DTensor now (idempotent). False
    when the installed torch's internals differ from what this module was written for (a
    warning says what)."""
    if _state["registered"]:
        return True
    problems = check_internals()
    if problems:
        warnings.warn("torch_tpu: DTensor attention sharding not registered; torch "
                      f"{torch.__version__}'s DTensor internals differ from 2.13.0's: "
                      + "; ".join(problems), RuntimeWarning, stacklevel=2)
        return False
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    for op, fn in ((FORWARD, _forward_strategy), (BACKWARD, _backward_strategy)):
        if propagator.op_strategy_funcs.get(op, fn) is not fn:
            continue  # a later torch knows this op itself: its strategy wins
        propagator.register_op_strategy(op, fn, None)
    _state["registered"] = True
    return True


def install() -> None:
    """Register now if torch.distributed.tensor is loaded, else when it first is."""
    if not _state["registered"]:
        _on_import.when_imported(_PACKAGE, register, lambda m: hasattr(m, "DTensor"))
