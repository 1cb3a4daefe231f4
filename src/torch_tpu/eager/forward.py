"""DeferAndFuse: a read of exactly the view that a write in the same graph made is the
written value, so a large buffer written in part and read back in part is never made.

Why: XLA's buffers are immutable, so a write into part of a storage is, inside a graph, a
new flat buffer (the old one updated); a later read of the same view slices that buffer.
XLA does not see through the slice when the view's offset is a parameter (offsets are
data: docs/DYNAMIC_SHAPES.md), so it makes the whole buffer even when nothing else reads
it. TRL's chunked log-prob allocates a (tokens, 32768) `torch.empty`, writes a
(tokens, 16) corner with `torch.mm(..., out=tile)` and reads the corner: ~20 ms of XLA:CPU
time a GRPO step made and filled 23 MB buffers that died at the flush.

How: the write's and the read's offsets are two scalar slots of the graph. Where their
values are equal, the graph's key says so: the read's slot takes the write's
(`alias`), as equal floats share a slot (eager/fuse.py), and the graph is traced with one
parameter for both. Inside the trace (`_storage.forwarding`, op/opcall.py) a write notes
the buffer it made with its view, its offset and its value; a read of that buffer with
the same view and the very same offset gets the value. A loop whose offsets are equal
at some steps and not at others has two graphs, one of each. Views whose elements share
memory are not forwarded (reading them back is not the value written).

What keeps it exact is the trace's test alone (the same view, the same offset object):
`alias` only ever makes two slots of the same value one, which changes no number, so a
pair that `_layout` got wrong costs a graph variant, never a wrong value.
"""
from __future__ import annotations

import array

from .. import _storage, metrics
from ..lowering.schema import OPT_TENSOR, OPT_TENSOR_LIST, SCALAR, SCALAR_KEYED, SCALAR_LIST

_PAIRS: dict = {}  # graph key -> its forwardable (read slot, write slot) word positions
_PAIRS_MAX = 4096


def alias(nodes, key: bytes, dyns, decode) -> bytes:
    """The graph key with each forwardable read's offset slot made its write's, where
    their values are equal (device scalars are one object per value); `key` itself when
    none is. `decode(key)`: the key's sections (fuse._decode)."""
    pairs = _PAIRS.get(key)
    if pairs is None:
        if len(_PAIRS) >= _PAIRS_MAX:
            _PAIRS.clear()
        pairs = _PAIRS[key] = _pairs(nodes, key, decode)
    if not pairs:
        return key
    words = None
    for read, write in pairs:
        a = words or memoryview(key).cast("q")
        if a[read] != a[write] and dyns[a[read]] is dyns[a[write]]:
            if words is None:
                words = array.array("q", a)
            words[read] = words[write]
    if words is None:
        return key
    metrics.count("fused_forwarded_reads")
    return words.tobytes()


def _pairs(nodes, key, decode) -> tuple:
    wiring, _, slots, types, donated = decode(key)
    a = memoryview(key).cast("q")
    start = len(a) - len(donated) - 1 - len(types) - 1 - len(slots)  # the slots' first word
    written = {}  # (node, output) -> (view, word position of its offset's slot)
    pairs = []
    d = 0
    for i, (node, ins) in enumerate(zip(nodes, wiring)):
        layout = _layout(node.entry)
        if layout is not None:
            bufs, writes = layout
            for (view, slot), src in zip(bufs, ins):
                if slot is not None and type(src) is tuple:
                    hit = written.get(src)
                    if hit is not None and hit[0] == view:
                        pairs.append((start + d + slot, hit[1]))
            for out, b in writes:
                view, slot = bufs[b]
                if slot is not None and _storage.distinct(view[0], view[1]):
                    written[(i, out)] = (view, start + d + slot)
        d += len(node.dyns)
    return tuple(pairs)


def _layout(entry):
    """(per input buffer: ((shape, stride, dtype), the node-local index of its offset among
    the node's scalars, or None where the offset is static), per write: (output, buffer)),
    in the order opcall's traced body takes them; None for a node that is not an op's."""
    plan, parts = entry.key[0], entry.key[1]
    kinds = getattr(plan, "kinds", None)
    if kinds is None or entry.fresh is None:
        return None
    bufs, index, d = [], {}, 0
    for i, (k, part) in enumerate(zip(kinds, parts)):
        if k <= OPT_TENSOR_LIST:
            for j, p in ([(None, part)] if k <= OPT_TENSOR else enumerate(part)):
                if p is None:
                    continue
                if p[0] == "#":  # a number passed for a tensor: a scalar of its own
                    d += 1
                    continue
                slot = None
                if p[2] == _storage.DYNAMIC:
                    slot, d = d, d + 1
                index[(i, j)] = len(bufs)
                bufs.append(((tuple(p[0]), tuple(p[1]), p[3]), slot))
        elif k in (SCALAR, SCALAR_KEYED):
            d += not isinstance(part, tuple)
        elif k == SCALAR_LIST:
            d += len(part)
    nfresh = len(entry.fresh)
    return bufs, [(nfresh + n, index[ij]) for n, ij in enumerate(entry.mut_slots) if ij in index]
