"""Lengths that are data: a boolean mask's selection, held at the mask's length (issue 31;
docs/DYNAMIC_SHAPES.md, "Lengths that are data").

`v[mask]` has as many elements as the mask has True values, a count only the data knows,
so each new count compiled the ops that read the selection again: TRL's GRPO logs the
mean, min and max of the lengths of the completions that ended (`lengths[~truncated]`),
3-5 small programs for every new count. Here the selection of a vector is held
(op/capacity.py) at the mask's length M: the selected values first, in order, then the
others. It is still a tensor of its true size N (`len(v[mask])` is N; reading it syncs
once, as the selection does on CUDA). Then, with programs keyed by M only:
- the row-wise ops of op/capacity.py run at M (`.float()` included, a cast into a fresh
  tensor);
- `sum`, `mean`, `min` and `max` of all of it reduce the first N rows, the others masked
  to the reduction's identity, with N as data;
- `x[mask] = selection` (`index_put_`) puts the k-th selected value at the mask's k-th
  True position.
Every other op reads the size-N tensor as before.
"""
from __future__ import annotations

import torch

from . import capacity
from .capacity import PASS, _at_capacity, _axis, _hold

_aten = torch.ops.aten


def _bool_mask(vals):
    """The boolean mask of `v[mask]` / `v[mask] = x` on a vector, on v's device, or None."""
    self, indices = vals[0], vals[1]
    if len(indices) != 1 or not isinstance(self, torch.Tensor) or self.dim() != 1:
        return None
    mask = indices[0]
    if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
            or mask.shape != self.shape or self.shape[0] < 2):
        return None
    return mask.to(self.device)


def _select(execute, plan, vals):
    """v[mask]: v reordered so the selected values come first (a stable sort of ~mask:
    one program per length of v), held at their count."""
    mask = _bool_mask(vals)
    if mask is None or _axis(vals[0]) is not None:
        return PASS
    n = int(mask.sum())
    order = torch.sort(mask.logical_not().to(torch.uint8), stable=True).indices
    capacity.metrics.count("capacity.selections")
    return _hold(vals[0].index_select(0, order), 0, n)


def _identity(name, dtype):
    if name in ("sum", "mean"):
        return 0
    if dtype.is_floating_point:
        return float("inf") if name == "min" else float("-inf")
    if dtype == torch.bool:
        return None
    info = torch.iinfo(dtype)
    return info.max if name == "min" else info.min


def _reduce(execute, plan, vals):
    """sum / mean / min / max of a whole held tensor: its rows past the true ones masked to
    the reduction's identity, the true count as data."""
    x = vals[0]
    found = _axis(x)
    if found is None:
        return PASS
    axis, tag = found
    name = plan.op.overloadpacket.__name__
    dtype = vals[1] if name in ("sum", "mean") else None
    fill = _identity(name, x.dtype)
    out = dtype or x.dtype
    if tag.rows == 0 or fill is None or (name == "mean" and not (
            out.is_floating_point or out.is_complex)):
        return PASS  # (torch's own result or error: an empty min, an integer mean)
    full = _at_capacity(x, axis, tag)
    shape = [1] * full.dim()
    shape[axis] = tag.cap
    pad = torch.arange(tag.cap, device=x.device).ge(tag.rows).view(shape)
    full = full.masked_fill(pad, fill)
    capacity.metrics.count("capacity.ops")
    if name == "mean":  # accumulated and divided in float32 for 16-bit floats, as torch does
        acc = torch.float32 if out in (torch.float16, torch.bfloat16) else out
        return (full.sum(dtype=acc) / tag.rows).to(out)
    if name == "sum":
        return full.sum(dtype=dtype)
    return getattr(full, name)()


def _copy(execute, plan, vals):
    """copy_ of a held tensor into a fresh one of its size (what `.float()` does: empty_like,
    then copy_): the copy at capacity, and the destination held on it. Only a destination
    that nothing else views (its storage's only tensor) changes its storage so."""
    dst, src = vals[0], vals[1]
    found = _axis(src)
    if found is None or not isinstance(dst, torch.Tensor) or _axis(dst) is not None:
        return PASS
    axis, tag = found
    if (dst.shape != src.shape or dst.device != src.device or not dst.is_contiguous()
            or dst.storage_offset() != 0 or any(s != 1 for s in src.shape[:axis])):
        return PASS
    st = dst.untyped_storage()
    # 2: dst's own reference and the storage object `st` (views would add theirs)
    if st.nbytes() != dst.numel() * dst.element_size() or torch._C._storage_Use_Count(st._cdata) != 2:
        return PASS
    full = _at_capacity(src, axis, tag)
    out = torch.empty(full.shape, dtype=dst.dtype, device=dst.device)
    out.copy_(full)
    capacity.metrics.count("capacity.ops")
    return _hold(out, axis, tag.rows, into=dst)


def _put(execute, plan, vals):
    """v[mask] = selection, the selection held at v's length: the k-th selected value goes
    to the mask's k-th True position."""
    self, _, values, accumulate = vals
    mask = _bool_mask(vals)
    tag = getattr(values.untyped_storage(), capacity.TAG, None) if values.dim() == 0 else None
    if tag is not None and tag.rows == 1 and values.storage_offset() == 0:
        values = values.as_strided([1], [1])  # torch squeezed a selection of one to 0-dim
    found = _axis(values, full=True)  # (all of them selected: the same programs)
    if (mask is None or accumulate or found is None or found[0] != 0 or values.dim() != 1
            or found[1].cap != self.shape[0] or values.device != self.device):
        return PASS
    tag = found[1]
    if int(mask.sum()) != tag.rows:
        return PASS  # torch's shape error, from the call as it is
    rank = mask.to(torch.int64).cumsum(0).sub(1).clamp(min=0)
    picked = _at_capacity(values, 0, tag).index_select(0, rank).to(self.dtype)
    capacity.metrics.count("capacity.ops")
    return self.copy_(torch.where(mask, picked, self))


capacity.SOURCES[_aten.index.Tensor] = _select
capacity.CALLS.update({
    _aten.sum.default: _reduce, _aten.mean.default: _reduce, _aten.min.default: _reduce,
    _aten.max.default: _reduce, _aten.copy_.default: _copy, _aten.index_put_.default: _put,
})
