"""How each collective moves data: XLA's own collective ops, or schedules of `ppermute`.

Measured on XLA:CPU between processes (gloo underneath, 2 processes, loopback), against
torch's gloo backend on the same machine:
  - `psum` runs at ~0.6-0.8x gloo's bandwidth at 1-64 MB; recursive doubling
    (`x + ppermute(x)` per round) beats gloo at every size for 2 processes: one round
    trip instead of a ring's two, the same bytes (n per rank), and an add XLA fuses. For
    power-of-two groups of up to 4 it stays ahead; bigger groups take `psum`, whose ring
    moves fewer bytes.
  - native `all_gather` has a fixed cost of several ms up to ~1 MB; a ring of `ppermute`s
    into a preallocated output is cheap there. From a few MB the native op is as fast or
    faster.
  - every member ends with bitwise-identical results: each round combines the same two
    values on both sides, and IEEE add/min/max/mul are commutative.
All functions run inside `shard_map` over the axis AXIS, on one flat block per member.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

AXIS = "g"
SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM = range(9)

DOUBLING_MAX_SIZE = 4          # recursive doubling for power-of-two groups up to this
RING_GATHER_MAX_BYTES = 2 << 20  # ppermute ring all_gather below this output size


def _i(v):
    """An index for dynamic_slice/update (all indices of one call must share a dtype)."""
    return jnp.asarray(v, jnp.int32)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _combine(op: int):
    return {SUM: lax.add, AVG: lax.add, PRODUCT: lax.mul, MIN: lax.min, MAX: lax.max,
            BAND: lax.bitwise_and, BOR: lax.bitwise_or, BXOR: lax.bitwise_xor}[op]


def _doubling(x, combine, size: int):
    k = 1
    while k < size:
        x = combine(x, lax.ppermute(x, AXIS, [(i, i ^ k) for i in range(size)]))
        k *= 2
    return x


def _bool_op(op: int) -> int:
    """Booleans reduce as 0/1 integers: SUM/MAX/BOR are "any", the rest "all" (BXOR:
    parity)."""
    return {SUM: MAX, AVG: MAX, BOR: MAX, MAX: MAX, PRODUCT: MIN, MIN: MIN,
            BAND: MIN, BXOR: BXOR}[op]


def all_reduce(x, op: int, size: int):
    """Every member's block reduced with torch's ReduceOp `op`."""
    if x.dtype == jnp.bool_:
        return all_reduce(x.astype(jnp.uint8), _bool_op(op), size).astype(jnp.bool_)
    if is_pow2(size) and size <= DOUBLING_MAX_SIZE:
        y = _doubling(x, _combine(op), size)
    elif op in (SUM, AVG):
        y = lax.psum(x, AXIS)
    elif op == MIN:
        y = lax.pmin(x, AXIS)
    elif op == MAX:
        y = lax.pmax(x, AXIS)
    else:  # PRODUCT and the bitwise ops have no XLA collective: gather, then fold
        g = lax.all_gather(x, AXIS)
        y = functools.reduce(_combine(op), [g[i] for i in range(size)])
    if op == AVG:
        if jnp.issubdtype(x.dtype, jnp.integer):
            return lax.div(y, jnp.asarray(size, y.dtype))  # truncates, as C division
        return (y / size).astype(x.dtype)
    return y


def all_gather(x, size: int):
    """The members' blocks concatenated in group-rank order."""
    n = x.shape[0]
    if n * size * x.dtype.itemsize >= RING_GATHER_MAX_BYTES:
        return lax.all_gather(x, AXIS, tiled=True)
    idx = lax.axis_index(AXIS)
    out = lax.dynamic_update_slice(jnp.zeros((n * size,), x.dtype), x, (_i(idx * n),))
    cur = x
    for s in range(1, size):
        cur = lax.ppermute(cur, AXIS, [(i, (i + 1) % size) for i in range(size)])
        out = lax.dynamic_update_slice(out, cur, (_i(((idx - s) % size) * n),))
    return out


def broadcast(x, root: int, size: int):
    """The root's block on every member: a binomial tree of ppermutes for power-of-two
    groups (log2(size) rounds, n bytes each), a masked psum otherwise."""
    idx = lax.axis_index(AXIS)
    if not is_pow2(size):
        masked = jnp.where(idx == root, x, jnp.zeros((), x.dtype))
        if x.dtype == jnp.bool_:
            return lax.psum(masked.astype(jnp.int32), AXIS) != 0
        return lax.psum(masked, AXIS)
    rel = idx ^ root
    k = 1
    while k < size:
        # members holding the data (rel < k) send to rel + k
        perm = [(i, i ^ k) for i in range(size) if (i ^ root) < k]
        got = lax.ppermute(x, AXIS, perm)
        x = jnp.where((rel >= k) & (rel < 2 * k), got, x)
        k *= 2
    return x


def reduce_scatter(x, op: int, size: int):
    """Chunk `rank` of the reduction of every member's (size * n) block."""
    n = x.shape[0] // size
    idx = lax.axis_index(AXIS)
    if x.dtype == jnp.bool_:
        return reduce_scatter(x.astype(jnp.uint8), _bool_op(op), size).astype(jnp.bool_)
    if size == 2 and op != AVG:
        # keep my chunk, send the peer's: one round of n bytes
        mine = lax.dynamic_slice(x, (_i(idx * n),), (n,))
        theirs = lax.dynamic_slice(x, (_i((1 - idx) * n),), (n,))
        return _combine(op)(mine, lax.ppermute(theirs, AXIS, [(0, 1), (1, 0)]))
    if op == SUM:
        return lax.psum_scatter(x, AXIS, tiled=True)
    return lax.dynamic_slice(all_reduce(x, op, size), (_i(idx * n),), (n,))


def scatter(x, root: int, size: int):
    """Chunk `rank` of the root's (size * n) block (the others pass zeros)."""
    idx = lax.axis_index(AXIS)
    masked = jnp.where(idx == root, x, jnp.zeros((), x.dtype))
    if x.dtype == jnp.bool_:
        return lax.psum_scatter(masked.astype(jnp.int32), AXIS, tiled=True) != 0
    return lax.psum_scatter(masked, AXIS, tiled=True)


def gathered_rows(h, size: int):
    """(size, len(h)): every member's small vector `h`, by group rank."""
    if size > 8:
        return lax.all_gather(h, AXIS)
    idx = lax.axis_index(AXIS)
    rows = lax.dynamic_update_slice(jnp.zeros((size, h.shape[0]), h.dtype), h[None],
                                    (_i(idx), _i(0)))
    cur = h
    for s in range(1, size):
        cur = lax.ppermute(cur, AXIS, [(i, (i + 1) % size) for i in range(size)])
        rows = lax.dynamic_update_slice(rows, cur[None], (_i((idx - s) % size), _i(0)))
    return rows
