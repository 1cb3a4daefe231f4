"""The XLA programs behind tpu_dist: one jitted `shard_map` per (group, collective, sizes,
dtypes, reduce op, root), cached.

Every program
  - runs over the group's 1-D mesh (axis "g"): one device per process, in group-rank
    order; every input is a flat 1-D block per process (a storage buffer as it is, no
    reshape), and so is every output;
  - takes and returns a token, chained over every program on the same set of processes,
    whatever group issued it: they run one at a time, in the order they were issued.
    XLA:CPU keeps one gloo communicator per set of devices, and its collectives carry no
    tags, so two programs over the same processes that overlap, or run in different
    orders on two processes, would pair the wrong messages (a gloo abort or mixed data).
    Every member of a group issues its collectives in the same order (as with NCCL), so
    one chain per process set gives every process the same order;
  - first all-gathers a small signature of the call (collective, reduce op, root, element
    counts, dtypes) and runs the collective only when every member agrees. Otherwise every
    member skips it and returns a negative token plus the signatures, from which the
    watchdog (or a waiting call) reports each rank's call: a shape mismatch is a clear
    error, never a gloo abort or a silent hang. Cost: one 64-byte all-gather in the same
    program. (A host callback would raise in place, but any callback makes JAX run the
    program synchronously on its slow path: ~5 ms a call.)

In-place collectives donate their input buffers when nothing else holds them, so XLA
reduces into the same memory (no fresh multi-megabyte output per call).
"""
from __future__ import annotations

import functools
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import torch.distributed as dist
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import _config, _jax_internals, _runtime
from . import _algorithms as A

AXIS = A.AXIS

# Reduce ops, numbered as torch's ReduceOp.RedOpType.
SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM = range(9)
assert (SUM, PREMUL_SUM) == (A.SUM, A.PREMUL_SUM)
OP_NAMES = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]

KINDS = ["barrier", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
         "all_to_all", "scatter", "gather", "all_to_all(uneven)", "max"]
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_DTYPES = sorted({str(d) for d in _runtime.TORCH_TO_JAX.values()})
_DTYPE_CODE = {d: i + 1 for i, d in enumerate(_DTYPES)}
_HEADER = 8
# TORCH_TPU_DIST_CHECK=0 skips the signature check (one small all-gather per collective):
# faster small collectives, but mismatched shapes then hang or abort in gloo.
_CHECK = _config.get("TORCH_TPU_DIST_CHECK")


class CollectiveMismatch(dist.DistBackendError):
    """Members of a group issued different collectives (or different sizes or dtypes)."""


# ---------------------------------------------------------------- the group's mesh
def process_device(process: int):
    """The device process `process` drives (`_runtime.device()` there): the one its binding
    chose among its local devices (_binding.py), which it publishes in JAX's key-value
    store. Read on demand: every member of a group publishes its own before it reads the
    others' (its first mesh), so no process waits for one outside its groups."""
    found = _DEVICES.get(process)
    if found is None:
        own = _runtime.device()
        if not _DEVICES:
            _DEVICES[jax.process_index()] = own
            if jax.process_count() > 1:
                _jax_internals.kv_store().key_value_set(_DEVICE_KEY % own.process_index,
                                                        str(own.id))
        if process in _DEVICES:
            return _DEVICES[process]
        wait_ms = int(_config.get("TORCH_TPU_DIST_INIT_TIMEOUT_S") * 1000)
        device_id = int(_jax_internals.kv_store().blocking_key_value_get(
            _DEVICE_KEY % process, wait_ms))
        found = _DEVICES[process] = next(d for d in jax.devices(own.platform) if d.id == device_id)
    return found


_DEVICES: dict = {}  # process index -> the device it drives
_DEVICE_KEY = "tpu_dist/device/%d"


class _Chain:
    """The order of the programs over one set of processes: the last one's token (this
    process's block), which the next one takes as input."""

    __slots__ = ("token",)

    def __init__(self):
        self.token = None


_CHAINS: dict = {}


class GroupMesh:
    """A 1-D mesh over some processes' devices, in group-rank order, and the token chain
    of its process set (shared with every other group over the same processes)."""

    def __init__(self, ranks, name: str):
        self.ranks = tuple(ranks)
        self.name = name
        self.size = len(self.ranks)
        devices = [process_device(r) for r in self.ranks]
        self.mesh = Mesh(np.array(devices, dtype=object), (AXIS,))
        self.sharding = NamedSharding(self.mesh, P(AXIS))
        self.key = (self.ranks, _runtime.device().platform)
        self.chain = _CHAINS.setdefault((tuple(sorted(self.ranks)), self.key[1]), _Chain())
        self.token = None  # this group's last program's output token (a global array)
        self.rows = None   # and the signatures it gathered
        self.failure = None  # the first failure reported on this group
        self.programs: dict = {}

    def glob(self, local):
        """A process-local flat block -> the group-wide array it is this process's shard of."""
        return _global(self.sharding, self.size, local)

    def next_token(self):
        if self.chain.token is None:
            self.chain.token = jax.device_put(np.zeros((1,), np.int32), _runtime.device())
        return self.glob(self.chain.token)


_ArrayImpl = _jax_internals.ArrayImpl  # bound once: `_global` runs for every collective


def _global(sharding, size, local):
    aval = jax.core.ShapedArray((local.shape[0] * size,), local.dtype)
    try:
        return _ArrayImpl(aval, sharding, [local], committed=True, _skip_checks=True)
    except TypeError:  # a jax without the private fast path (_jax_internals.py)
        return jax.make_array_from_single_device_arrays(aval.shape, sharding, [local])


def local(arr):
    """This process's block of a group-wide array."""
    try:
        return arr._arrays[0]  # what addressable_data(0) wraps, without a new wrapper (private)
    except AttributeError:
        return arr.addressable_data(0)


# ---------------------------------------------------------------- the signature check
def _signature(kind: str, op: int, root: int, ins, outs) -> np.ndarray:
    total_in = sum(n for n, _ in ins)
    total_out = sum(n for n, _ in outs)
    first = (ins or outs or [(0, None)])[0][1]
    crc = zlib.crc32(repr((kind, op, root, ins, outs)).encode())
    return np.array([_KIND_CODE[kind], op, root, len(ins), total_in, total_out,
                     _DTYPE_CODE.get(str(first), 0), crc], dtype=np.int64)


def describe(row) -> str:
    kind, op, root, count, n_in, n_out, dtype, _ = (int(v) for v in row)
    name = KINDS[kind] if 0 <= kind < len(KINDS) else f"kind {kind}"
    dname = _DTYPES[dtype - 1] if 0 < dtype <= len(_DTYPES) else "?"
    parts = [name]
    if name in ("all_reduce", "reduce", "reduce_scatter"):
        parts.append(f"op={OP_NAMES[op] if 0 <= op < len(OP_NAMES) else op}")
    if name in ("broadcast", "reduce", "scatter", "gather"):
        parts.append(f"root={root}")
    return (" ".join(parts) + f" on {count} tensor(s) of {dname}, {n_in} element(s) in, "
            f"{n_out} out")


def mismatch_message(group_name, ranks, rows) -> str | None:
    """The error for a refused call, from the signatures every member contributed; None
    when they agree (the call was refused because an earlier one on the group was)."""
    rows = np.asarray(rows).reshape(len(ranks), _HEADER)
    if (rows == rows[0:1]).all():
        return None
    lines = [f"  rank {r}: {describe(row)}" for r, row in zip(ranks, rows)]
    return (f"tpu_dist: mismatched collective on group {group_name!r}: the ranks called "
            "different collectives, or passed tensors of different shapes or dtypes:\n"
            + "\n".join(lines) + "\nEvery rank of a group must issue the same collectives, in "
            "the same order, with tensors of the same size and dtype.")


# ---------------------------------------------------------------- the bodies
# Each body maps this process's input blocks to its output blocks, inside shard_map.
def _body(kind: str, op: int, root: int, size: int, ins, outs, extra):
    idx = lambda: lax.axis_index(AXIS)  # noqa: E731

    if kind == "barrier":
        return lambda *xs: ()
    if kind == "all_reduce":
        return lambda *xs: tuple(A.all_reduce(x, op, size) for x in xs)
    if kind == "max":  # a scalar pmax, used to agree on paddings
        return lambda *xs: tuple(lax.pmax(x, AXIS) for x in xs)
    if kind == "broadcast":
        return lambda *xs: tuple(A.broadcast(x, root, size) for x in xs)
    if kind == "reduce":
        return lambda *xs: tuple(jnp.where(idx() == root, A.all_reduce(x, op, size), x)
                                 for x in xs)
    if kind in ("all_gather", "gather"):
        split = extra == "split"

        def all_gather(*xs):
            res = []
            for x in xs:
                g = A.all_gather(x, size)
                n = x.shape[0]
                res.extend([g[i * n:(i + 1) * n] for i in range(size)] if split else [g])
            return tuple(res)

        return all_gather
    if kind == "reduce_scatter":
        # inputs: one (size*n) block per output, or `size` blocks of n per output
        per = len(ins) // len(outs)

        def reduce_scatter(*xs):
            res = []
            for j in range(len(outs)):
                parts = xs[j * per:(j + 1) * per]
                x = parts[0] if per == 1 else jnp.concatenate(parts)
                res.append(A.reduce_scatter(x, op, size))
            return tuple(res)

        return reduce_scatter
    if kind == "scatter":
        return lambda *xs: (A.scatter(xs[0] if len(xs) == 1 else jnp.concatenate(xs), root,
                                      size),)
    if kind == "all_to_all":
        return lambda *xs: tuple(lax.all_to_all(x, AXIS, 0, 0, tiled=True) for x in xs)
    if kind == "all_to_all(uneven)":
        return _uneven_all_to_all(size, extra)
    raise ValueError(kind)


def _uneven_all_to_all(size, extra):
    """Uneven splits: pad every chunk to the group-wide largest one (`pad` rows), exchange
    evenly, then compact. The row maps come from the host as inputs, so one program serves
    every split pattern with the same totals."""
    pad, inner, n_out = extra

    def a2a(x, send_index, recv_index):
        rows = x.reshape(-1, inner) if inner else x.reshape(-1, 1)
        rows = jnp.concatenate([rows, jnp.zeros((1, rows.shape[1]), rows.dtype)])
        padded = jnp.take(rows, send_index, axis=0)  # (size*pad, inner); index -1 = zeros
        got = lax.all_to_all(padded, AXIS, 0, 0, tiled=True)
        out = jnp.take(got, recv_index, axis=0)
        return (out.reshape(-1),)

    return a2a


# ---------------------------------------------------------------- compile and run
class Program:
    __slots__ = ("fn", "n_out", "donate")

    def __init__(self, fn, n_out, donate):
        self.fn, self.n_out, self.donate = fn, n_out, donate


def program(gm: GroupMesh, kind: str, ins, outs, op: int = SUM, root: int = 0,
            extra=None, donate: tuple = (), sig=None, alias: int = 0) -> Program:
    """The cached program for this call.

    `ins`/`outs`: tuples of (elements, dtype name) per flat block; `donate`: the input
    positions whose buffers XLA may reuse for outputs of the same size; `alias`: how many
    trailing inputs are only there to lend their memory to an output (donated, unread);
    `sig`: what the members must agree on, when it is not (ins, outs)."""
    key = (kind, ins, outs, op, root, extra, donate, sig, alias)
    prog = gm.programs.get(key)
    if prog is None:
        prog = gm.programs[key] = _compile(gm, kind, ins, outs, op, root, extra, donate,
                                           sig, alias)
    return prog


def _compile(gm, kind, ins, outs, op, root, extra, donate, sig, alias) -> Program:
    size = gm.size
    body = _body(kind, op, root, size, ins, outs, extra)
    header = _signature(kind, op, root, *(sig if sig is not None else (ins, outs)))
    out_blocks = [(n, jnp.dtype(d)) for n, d in outs]

    def checked(tok, *xs):
        if _CHECK:
            rows = A.gathered_rows(jnp.asarray(header), size)
            ok = jnp.all(rows == rows[0:1]) & (tok[0] >= 0)
        else:
            rows = jnp.broadcast_to(jnp.asarray(header), (size, _HEADER))
            ok = tok[0] >= 0

        def run(xs):
            return tuple(body(*(xs[:len(xs) - alias])))

        def refuse(xs):
            return tuple(jnp.zeros((n,), d) for n, d in out_blocks)

        ys = lax.cond(ok, run, refuse, xs)
        # The token counts this group's programs; a negative token marks a refused call
        # (and poisons the chain, so every member skips the collectives that follow).
        tok_out = jnp.where(ok, tok + 1, jnp.full_like(tok, -1))
        return (tok_out, rows.reshape(-1), *ys)

    n_args = 1 + len(ins)
    fn = jax.shard_map(checked, mesh=gm.mesh, in_specs=(P(AXIS),) * n_args,
                       out_specs=(P(AXIS),) * (2 + len(outs)), check_vma=False)
    jitted = jax.jit(fn, donate_argnums=tuple(1 + i for i in donate), keep_unused=True)
    return Program(jitted, len(outs), donate)


def run(gm: GroupMesh, prog: Program, blocks) -> list:
    """Issue `prog` on this process's `blocks`; returns this process's output blocks
    (futures: nothing here waits for the result)."""
    args = [gm.glob(b) for b in blocks]
    res = prog.fn(gm.next_token(), *args)
    gm.token = res[0]
    gm.chain.token = local(res[0])
    gm.rows = res[1]
    return [local(a) for a in res[2:]]


# XLA nests the error of a failed program's input once per program downstream of it
_NESTED = re.compile(r"(?:(?:INTERNAL: )?Error dispatching computation: )+")


def explain(text: str) -> str:
    """A JAX runtime error from a collective, in words."""
    text = _NESTED.sub("", text).strip()
    lowered = text.lower()
    if any(s in lowered for s in ("connection reset", "connection closed", "broken pipe",
                                  "socket closed", "connection refused", "eof")):
        return ("tpu_dist: a peer process closed its connection during a collective: "
                f"it probably died or exited early. ({text[:400]})")
    if "timed out" in lowered or "deadline" in lowered or "timeout" in lowered:
        return f"tpu_dist: a collective timed out. ({text[:400]})"
    return f"tpu_dist: collective failed: {text[:600]}"
