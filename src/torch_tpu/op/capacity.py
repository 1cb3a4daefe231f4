"""Tensors that grow a step at a time, held at a capacity: one program set per bucket of
their length, not one per length (issue 31; docs/DYNAMIC_SHAPES.md, "Growing tensors").

A loop that grows a tensor (`idx = torch.cat((idx, nxt), dim=1)` every token, a position
`torch.arange(0, t)` beside it) gives every op downstream a new shape each step, so each
step compiled its own programs. Here such a tensor is an ordinary torch tensor of its
true size T (`idx.size(1)` is T) whose storage holds a bucket's capacity C of rows; the
storage carries a `Capacity` tag. An op that is row-wise along that dimension (each row of
its result depends on the same row of its inputs only: pointwise ops, a linear layer, a
layer norm over the other dimensions, an embedding, causal attention) then runs on all C
rows, keyed by C, and its results are again size-T tensors over capacity storages. What
the rows past T hold is never read by a row below T, so the first T rows are the values of
the op at size T, exactly. Every other op reads the size-T tensor as it is, a view of part
of its buffer (its offset is data), so nothing changes for it.

Where tags start (`SOURCES`): a `cat` whose first input is tagged, or whose call (same
dtype, dimension and other inputs) last made a result 1..GROWTH rows shorter; an `arange`
whose call last made a shorter one. The first step of a loop runs as before; from the
second the loop runs at capacity. Only the outermost dimension that is not of size 1 is
held so (a batch of 1, or a sequence-first layout), so that the size-T tensor is the first
rows of its storage and contiguous as torch expects.

Rows past T start as zeros (cat) or as the range's start (arange), so an index read from
them is in bounds wherever the true ones are. The executors (Strict and Debug,
DeferAndFuse) call `route` from their Python `execute`, where every call with a tagged
input arrives: the C fast path finds no cached entry for a size-T key, since none is ever
compiled for one (`TORCH_TPU_CAPACITY=0` turns this off).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _C, _buckets, _config, _program_cache, metrics
from . import current

TAG = "_tpu_capacity"
GROWTH = 8  # a call whose result grew by 1..GROWTH rows since its last one is a growing loop
PASS = object()  # route's answer for a call it leaves as it is
_ENABLED = _config.get("TORCH_TPU_CAPACITY")
_live = [False]  # a storage was tagged in this process
_busy = [False]  # route is running a call at capacity: the ops it issues pass
_SEEN: dict = {}  # a source call's key -> the rows of its last result
_STARTS: dict = {}  # ... -> the lengths at which its results grew, after a shorter one


class Capacity(NamedTuple):
    """A storage held at a capacity: `rows` true rows of `row` elements of `itemsize`
    bytes, room for `cap`. `nbytes` is the storage's size when tagged: a storage torch
    resized since is no longer one."""
    rows: int
    cap: int
    row: int
    itemsize: int
    nbytes: int


def _axis(t, full=False):
    """(dimension, Capacity) when `t` is the true rows of a tagged storage along one
    dimension, else None. A full capacity is the tensor at capacity already: None, but
    for `full` (a cat growing it)."""
    if not isinstance(t, torch.Tensor):
        return None
    st = t.untyped_storage()
    tag = getattr(st, TAG, None)
    if (tag is None or (tag.rows == tag.cap and not full) or tag.itemsize != t.element_size()
            or tag.nbytes != st.nbytes()):
        return None
    axis = None
    extent = t.storage_offset()
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if size == tag.rows and stride == tag.row and axis is None:
            axis = d
        elif size != 1:
            if stride < 0:
                return None
            extent += (size - 1) * stride
    if axis is None or extent >= tag.row:
        return None
    return axis, tag


def holds(t) -> bool:
    """Whether `t` is the true rows of a storage held at a capacity."""
    return _live[0] and _axis(t) is not None


def _at_capacity(t, axis, tag):
    size = list(t.shape)
    size[axis] = tag.cap
    # a dimension of size 1 has a stride that depends on T (a view's batch dimension): one
    # that depends on C keeps the call's key the same at every T
    stride = [tag.cap * tag.row if s == 1 else st for s, st in zip(size, t.stride())]
    return t.as_strided(size, stride, t.storage_offset())


def _hold(full, axis, rows, into=None):
    """A fresh result `full`, `cap` rows along `axis` -> the tensor of its first `rows`
    there, on the same storage (`into`, when given, is set to it); tagged when those rows
    lead its memory."""
    size = list(full.shape)
    cap = size[axis]
    size[axis] = rows
    st = full.untyped_storage()
    if into is None:
        into = torch.empty(0, dtype=full.dtype, device=full.device)
    t = into.set_(st, full.storage_offset(), size, full.stride())
    row = full.stride(axis)
    inner = sum((s - 1) * full.stride(d) for d, s in enumerate(size) if d != axis and s != 1)
    if full.storage_offset() == 0 and inner < row and cap * row * full.element_size() == st.nbytes():
        setattr(st, TAG, Capacity(rows, cap, row, full.element_size(), st.nbytes()))
        _live[0] = True
    return t


def _grown(key, rows) -> bool:
    """Whether this call's result is 1..GROWTH rows longer than its last one's, or as long
    as one whose growth was seen before. The second is a loop run again (a second
    `generate` call): its shorter steps hit the programs compiled for them the first time,
    in C, and never reach this function, so its last call here was the previous run's."""
    if len(_SEEN) > 4096:
        _SEEN.clear()
        _STARTS.clear()
    prev = _SEEN.get(key)
    _SEEN[key] = rows
    if prev is not None and 0 < rows - prev <= GROWTH:
        starts = _STARTS.setdefault(key, set())
        if len(starts) < 64:
            starts.add(rows)
        return True
    return rows in _STARTS.get(key, ())


# ----------------------------------------------------------------------- sources of tags
def _cat(execute, plan, vals):
    tensors, dim = vals
    if len(tensors) < 2 or not all(isinstance(t, torch.Tensor) for t in tensors):
        return PASS
    first = tensors[0]
    nd = first.dim()
    if nd == 0:
        return PASS
    dim = dim % nd
    if any(t.dim() != nd or t.dtype != first.dtype or t.shape[:dim] != first.shape[:dim]
           or t.shape[dim + 1:] != first.shape[dim + 1:] for t in tensors[1:]):
        return PASS
    if any(s != 1 for s in first.shape[:dim]) or first.requires_grad:
        return PASS
    rows = sum(t.shape[dim] for t in tensors)
    found = _axis(first, full=True)
    if found is not None and found[0] == dim:
        base = _at_capacity(first, dim, found[1])
        at = found[1].rows
    elif _grown(("cat", first.dtype, nd, dim, tuple(first.shape[dim + 1:]),
                 tuple(t.shape[dim] for t in tensors[1:])), rows):
        base, at = first, first.shape[dim]
    else:
        return PASS
    cap = max(_buckets.bucket(rows), base.shape[dim])
    pad = [0, 0] * (nd - dim - 1) + [0, cap - base.shape[dim]]
    full = torch.nn.functional.pad(base, pad) if cap > base.shape[dim] else base.clone()
    for t in tensors[1:]:
        n = t.shape[dim]
        full.narrow(dim, at, n).copy_(t)
        at += n
    metrics.count("capacity.grown")
    held = _hold(full, dim, rows)
    # a loop's step ends where it grows its tensor: DeferAndFuse runs each step as one
    # graph, the same program at every length of one capacity, instead of one graph of
    # many steps that grows until its compile never ends
    current.executor().flush("grown")
    return held


def _arange(execute, plan, vals):
    name = plan.op._overloadname
    if name == "default":
        start, end, step = 0, vals[0], 1
    elif name == "start":
        start, end, step = vals[0], vals[1], 1
    elif name == "start_step":
        start, end, step = vals[0], vals[1], vals[2]
    else:
        return PASS
    if not all(type(v) is int for v in (start, end, step)) or step == 0:
        return PASS
    rows = len(range(start, end, step))
    if rows < 2 or not _grown(("arange", plan.op, start, step, vals[-4]), rows):
        return PASS
    cap = _buckets.bucket(rows)
    grown = list(vals)
    grown[1 if name != "default" else 0] = start + cap * step
    full = execute(plan, grown)
    # rows past the true ones hold `start`: an index as valid as the first one
    full.masked_fill_(full.ge(end) if step > 0 else full.le(end), start)
    metrics.count("capacity.grown")
    return _hold(full, 0, rows)


# ops that start a held tensor: op -> (execute, plan, vals) -> the result, or PASS
SOURCES = {torch.ops.aten.cat.default: _cat, torch.ops.aten.arange.default: _arange,
            torch.ops.aten.arange.start: _arange, torch.ops.aten.arange.start_step: _arange}


# ------------------------------------------------------------------ row-wise ops' rules
# Each rule: (vals) -> (vals at capacity, the Capacity, the dimension its results are held
# at: None for none) or None (the call runs as it is).
def _pointwise(vals):
    """Every tensor broadcast along one dimension (counted from the right); the tagged ones
    at it, the others of size 1 there or without it."""
    at = None
    grown = list(vals)
    for i, v in enumerate(vals):
        found = _axis(v)
        if found is not None:
            axis, tag = found
            if at is not None and at != (axis - v.dim(), tag.rows, tag.cap):
                return None
            at, held = (axis - v.dim(), tag.rows, tag.cap), tag
            grown[i] = _at_capacity(v, axis, tag)
    if at is None:
        return None
    right = at[0]
    nd = 0
    for i, v in enumerate(vals):
        if isinstance(v, torch.Tensor):
            nd = max(nd, v.dim())
            if grown[i] is v and v.dim() + right >= 0 and v.shape[v.dim() + right] != 1:
                return None
    return grown, held, nd + right


def _first(vals, axis_ok):
    """The first argument tagged at a dimension `axis_ok(dim, tensor)` accepts; every other
    tensor argument untagged."""
    found = _axis(vals[0])
    if found is None or not axis_ok(found[0], vals[0]):
        return None
    if any(_axis(v) is not None for v in vals[1:]):
        return None
    grown = list(vals)
    grown[0] = _at_capacity(vals[0], *found)
    return grown, found[1], found[0]


def _embedding(vals):
    found = _axis(vals[1])
    if found is None or _axis(vals[0]) is not None:
        return None
    grown = list(vals)
    grown[1] = _at_capacity(vals[1], *found)
    return grown, found[1], found[0]


def _matmul(vals):
    """addmm(bias, m1, m2) / mm(m1, m2): the rows of m1."""
    i = 1 if len(vals) > 3 else 0
    found = _axis(vals[i])
    if found is None or found[0] != 0 or any(_axis(v) is not None for j, v in enumerate(vals) if j != i):
        return None
    if i == 1 and vals[0].dim() == 2 and vals[0].shape[0] != 1:
        return None
    grown = list(vals)
    grown[i] = _at_capacity(vals[i], *found)
    return grown, found[1], 0


def _layer_norm(vals):
    return _first(vals, lambda d, t: d < t.dim() - len(vals[1]))


def _softmax(vals):
    return _first(vals, lambda d, t: d != vals[1] % t.dim())


def _attention(vals):
    """Causal attention of queries, keys and values of one length, no mask, no dropout: row
    i reads rows 0..i."""
    q, k, v, bias, dropout, causal = vals[:6]
    if bias is not None or dropout != 0.0 or not causal:
        return None
    found = [_axis(x) for x in (q, k, v)]
    if any(f is None or f[0] != x.dim() - 2 for f, x in zip(found, (q, k, v))):
        return None
    if len({(f[1].rows, f[1].cap) for f in found}) != 1:
        return None
    grown = list(vals)
    for i in range(3):
        grown[i] = _at_capacity(vals[i], *found[i])
    return grown, found[0][1], q.dim() - 2


def _index(vals):
    """x[:, [-1]]: one index tensor, along the held dimension, made non-negative with the
    true length by ops of its own shape (the length is data); the result is not held."""
    self, indices = vals
    found = _axis(self)
    if found is None:
        return None
    axis, tag = found
    if len(indices) <= axis or any(i is not None for j, i in enumerate(indices) if j != axis):
        return None
    i = indices[axis]
    if not isinstance(i, torch.Tensor) or i.dtype not in (torch.int64, torch.int32):
        return None
    i = i.to(self.device)
    i = i + i.lt(0) * tag.rows
    # an index out of the true range points past the capacity: the bounds check raises
    i = i.masked_fill(i.lt(0) | i.ge(tag.rows), tag.cap)
    grown = list(indices)
    grown[axis] = i
    return [_at_capacity(self, axis, tag), grown], tag, None


_aten = torch.ops.aten
_RULES = {
    _aten.embedding.default: _embedding,
    _aten.addmm.default: _matmul,
    _aten.mm.default: _matmul,
    _aten.native_layer_norm.default: _layer_norm,
    _aten._softmax.default: _softmax,
    _aten._log_softmax.default: _softmax,
    _aten._scaled_dot_product_fused_attention_overrideable.default: _attention,
    _aten.index.Tensor: _index,
    _aten.clone.default: _pointwise,
    _aten._to_copy.default: lambda vals: None if vals[3] not in (None, vals[0].device) else _pointwise(vals),
}


# ops that lengths.py runs whole for a held argument: op -> (execute, plan, vals) -> the
# result, or PASS
CALLS: dict = {}


def _rule(plan):
    if plan.seeded:  # a random op draws per element: at C it would draw other numbers
        return None
    rule = _RULES.get(plan.op)
    if rule is None and not plan.mutable and torch.Tag.pointwise in plan.op.tags:
        rule = _pointwise
    return rule


def route(execute, plan, vals):
    """An executor's `execute(plan, vals)` for a call that grows a tensor or reads one:
    the call at capacity, or PASS (the caller runs it as it is)."""
    if not _ENABLED or _busy[0]:
        return PASS
    for table in (SOURCES, CALLS if _live[0] else None):
        call = table and table.get(plan.op)
        if call is not None:
            _busy[0] = True
            try:
                result = call(execute, plan, vals)
            finally:
                _busy[0] = False
            if result is not PASS:
                return result
    if not _live[0]:
        return PASS
    rule = _rule(plan)
    if rule is None:
        return PASS
    found = rule(vals)
    if found is None:
        return PASS
    grown, tag, axis = found
    metrics.count("capacity.ops")
    _busy[0] = True
    try:
        result = execute(plan, grown)
    finally:
        _busy[0] = False
    if axis is None:
        return result

    def hold(r):
        if isinstance(r, torch.Tensor) and r.dim() > axis and r.shape[axis] == tag.cap:
            return _hold(r, axis, tag.rows)
        return r

    held = hold(result) if isinstance(result, torch.Tensor) else type(result)(map(hold, result))
    if _IN_C:
        _hold_in_c(plan, vals, grown, held)
    return held


_IN_C = _config.get("TORCH_TPU_C_FAST_PATH")
_MAX_HELD = 512  # calls held in C per op, past which they start again


def _hold_in_c(plan, vals, grown, result):
    """Let the C paths (DeferAndFuse's recording, Strict's run) make this call as route just
    did, with no Python: under the call's own key, the entry of its call at the capacity
    and how each result is held (OpPlan.held, csrc/kernel.cpp find_entry). A node is the
    entry's at the capacity, so the graph of a step is one program at every length of a
    capacity, as before. Only where that entry makes every result fresh, and the call's
    buffers and scalars are the same objects at both sizes (a held tensor is its storage's
    first rows); returns that are values (attention's sizes) are the entry's at both, as
    route returns them. The alias leaves with the entry's program (add_alias)."""
    now, at = _C.scan(plan, vals), _C.scan(plan, grown)
    if (now is None or at is None or len(now[1]) != len(at[1])
            or any(a is not b for a, b in zip(now[1], at[1]))):
        return
    # The scalars: the same objects (device scalars are one object per value), but for the
    # offsets that are data at the true size and fixed at the capacity (0 there): those the
    # C path checks are still those objects, and passes the others.
    keep, expect = [], []
    for i, d in enumerate(now[2]):
        if len(keep) < len(at[2]) and d is at[2][len(keep)]:
            keep.append(i)
        else:
            expect.append((i, d))
    if len(keep) != len(at[2]):
        return
    prec = plan.precision() if plan.precision is not None else None
    entry = plan.cache.get(at[0] if prec is None else (at[0], prec))
    if entry is None or entry.fn is None or entry.mut_slots or entry.fresh is None:
        return
    if entry.checks is not None and not getattr(current.executor(), "deferred", False):
        return  # (Strict runs an op with device-side asserts in Python)
    rets = [result] if isinstance(result, torch.Tensor) else list(result)
    if len(rets) != len(entry.structure) or any(s[0] not in ("fresh", "value")
                                                for s in entry.structure):
        return
    outs = [r for r, s in zip(rets, entry.structure) if s == ("fresh",)]
    if len(outs) != len(entry.fresh):
        return
    items = []
    for t, (shape, _, _) in zip(outs, entry.fresh):
        if not isinstance(t, torch.Tensor):
            return
        if tuple(t.shape) == tuple(shape):
            items.append(None)
        else:
            items.append((tuple(t.shape), TAG, getattr(t.untyped_storage(), TAG, None)))
    if len(plan.held) >= _MAX_HELD:
        plan.held.clear()
    pick = None if not expect else (tuple(keep), tuple(expect))
    key = now[0] if prec is None else (now[0], prec)
    if _program_cache.add_alias(entry, plan.held, key):
        plan.held[key] = (entry, items, pick)
        metrics.count("capacity.held_in_c")
