"""Functional collectives (`torch.ops._c10d_functional.*`) on tpu tensors.

Their default kernels are CompositeExplicitAutograd C++ that call the resolved group's
C++ methods; for `all_gather_into_tensor` and `reduce_scatter_tensor` that path goes to
`getBackend(device)`, which a Python process group does not have. PrivateUse1 kernels
take precedence over CompositeExplicitAutograd for tpu tensors, so each functional op
gets one here that calls the tpu_dist group directly and returns a fresh tensor holding
the result future. No Work is registered: `wait_tensor` is then the identity, which is
right because the result buffer itself carries the dependency. Over any other group
(gloo) the op runs on host copies instead (`_staged.functional`).
"""
from __future__ import annotations

import torch
import torch.distributed  # noqa: F401  (defines the _c10d_functional ops)

from ..eager.strict import new_tensor
from . import _staged, collectives as C
from .process_group import ProcessGroupTPU

_LIB = torch.library.Library("_c10d_functional", "IMPL")
_OPS = {"sum": C.SUM, "avg": C.AVG, "product": C.PRODUCT, "min": C.MIN, "max": C.MAX,
        "band": C.BAND, "bor": C.BOR, "bxor": C.BXOR}


def _group(group_name) -> ProcessGroupTPU:
    if isinstance(group_name, str):
        pg = torch._C._distributed_c10d._resolve_process_group(group_name)
    else:
        pg = group_name
    if not isinstance(pg, ProcessGroupTPU):
        raise RuntimeError(
            f"functional collective on tpu tensors over group {group_name!r}, which is not a "
            f"tpu_dist group ({type(pg).__name__}): create it with backend 'tpu_dist'")
    return pg


def _op(reduce_op: str) -> int:
    try:
        return _OPS[reduce_op.lower()]
    except KeyError:
        raise ValueError(f"tpu_dist: unsupported reduce op {reduce_op!r}") from None


def _fresh(shape, like: torch.Tensor, flat) -> torch.Tensor:
    return new_tensor(torch.Size(shape), like.dtype, flat)


def _reduced(pg, inputs, op, kind="all_reduce", root=0):
    inputs = list(inputs)
    live = [t for t in inputs if t.numel()]
    if not live:
        return [t.clone() for t in inputs]
    blocks, ins, _ = pg._inputs(live, allow_donate=False)
    flats = iter(pg._issue(pg.mesh(), kind, blocks, ins, ins, op, root))
    return [_fresh(t.shape, t, next(flats)) if t.numel() else t.clone() for t in inputs]


def all_reduce(inp, reduce_op, group_name):
    return _reduced(_group(group_name), [inp], _op(reduce_op))[0]


def all_reduce_(inp, reduce_op, group_name):
    _group(group_name)._inplace("all_reduce", [inp], _op(reduce_op))
    return inp


def all_reduce_coalesced(inputs, reduce_op, group_name):
    return _reduced(_group(group_name), inputs, _op(reduce_op))


def all_reduce_coalesced_(inputs, reduce_op, group_name):
    _group(group_name)._inplace("all_reduce", list(inputs), _op(reduce_op))
    return inputs


def broadcast(inp, src, group_name):
    return _reduced(_group(group_name), [inp], C.SUM, "broadcast", src)[0]


def broadcast_(inp, src, group_name):
    _group(group_name)._inplace("broadcast", [inp], C.SUM, src)
    return inp


def _check_size(pg, group_size):
    if group_size != pg.size():
        raise ValueError(f"tpu_dist: group_size {group_size} does not match the group's size "
                         f"{pg.size()}")


def _gathered_shape(inp, w):
    shape = list(inp.shape) or [1]
    shape[0] *= w
    return shape


def all_gather_into_tensor(inp, group_size, group_name):
    pg = _group(group_name)
    _check_size(pg, group_size)
    shape = _gathered_shape(inp, pg.size())
    if not inp.numel():
        return inp.new_empty(shape)
    (flat,) = pg._gather(inp, split=False)
    return _fresh(shape, inp, flat)


def all_gather_into_tensor_out(inp, group_size, group_name, *, out):
    pg = _group(group_name)
    _check_size(pg, group_size)
    pg.all_gather_single(out, inp)
    return out


def all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    return [all_gather_into_tensor(t, group_size, group_name) for t in inputs]


def _scattered_shape(inp, w):
    shape = list(inp.shape)
    if not shape or shape[0] % w:
        raise ValueError(f"tpu_dist reduce_scatter_tensor: dim 0 of {tuple(inp.shape)} does not "
                         f"split evenly over {w} ranks")
    shape[0] //= w
    return shape


def reduce_scatter_tensor(inp, reduce_op, group_size, group_name):
    pg = _group(group_name)
    _check_size(pg, group_size)
    shape = _scattered_shape(inp, pg.size())
    out_n = inp.numel() // pg.size()
    if not out_n:
        return inp.new_empty(shape)
    blocks, ins, _ = pg._inputs([inp], allow_donate=False)
    (flat,) = pg._issue(pg.mesh(), "reduce_scatter", blocks, ins, ((out_n, ins[0][1]),),
                        _op(reduce_op))
    return _fresh(shape, inp, flat)


def reduce_scatter_tensor_out(inp, reduce_op, group_size, group_name, *, out):
    out.copy_(reduce_scatter_tensor(inp, reduce_op, group_size, group_name).view(out.shape))
    return out


def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    return [reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in inputs]


def all_to_all_single(inp, output_split_sizes, input_split_sizes, group_name):
    from ._alltoall import all_to_all_single as a2a

    pg = _group(group_name)
    rows = sum(output_split_sizes) if output_split_sizes else (inp.shape[0] if inp.dim() else 1)
    out = inp.new_empty([rows, *inp.shape[1:]])
    a2a(pg, out, inp, [int(s) for s in output_split_sizes or []],
        [int(s) for s in input_split_sizes or []])
    return out


_KERNELS = {
    "all_reduce": all_reduce, "all_reduce_": all_reduce_,
    "all_reduce_coalesced": all_reduce_coalesced, "all_reduce_coalesced_": all_reduce_coalesced_,
    "broadcast": broadcast, "broadcast_": broadcast_,
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather_into_tensor_out": all_gather_into_tensor_out,
    "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
    "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
    "all_to_all_single": all_to_all_single,
}


def _routed(name, fn):
    """`fn` for a tpu_dist group; any other group (gloo) stages through the host. The
    group is the last positional argument of every op here (`out` is keyword-only)."""
    op = getattr(torch.ops._c10d_functional, name).default

    def kernel(*args, **kwargs):
        pg = args[-1]
        if isinstance(pg, str):
            pg = torch._C._distributed_c10d._resolve_process_group(pg)
        if isinstance(pg, ProcessGroupTPU):
            return fn(*args, **kwargs)
        return _staged.functional(op, args, kwargs)
    return kernel


def register() -> None:
    for name, fn in _KERNELS.items():
        if hasattr(torch.ops._c10d_functional, name):
            _LIB.impl(name, _routed(name, fn), "PrivateUse1")
