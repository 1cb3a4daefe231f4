"""DeferAndFuse, the flush pipeline: pending nodes -> one cached XLA program -> buffers.

Steps:
  plan            (C: _C.flush_plan, one pass over the nodes) number the nodes; map every
                  input to an external buffer or a node output; keep as outputs only the
                  values a live storage still holds (dead intermediates never get a buffer)
  graph_key       op entries + wiring + outputs + scalar types: tensor data and scalar
                  values are parameters, so a changing learning rate does not recompile
  lookup/compile  one jax.jit per key; a miss explains what differed from the last graph
                  with the same ops (the recompile reason in metrics)
  run             external buffers overwritten by the graph are donated to cut peak memory
  write_back      results become the storages' buffers
"""
from __future__ import annotations

import collections
import os
import sys
import time

import jax

from .. import _C, _storage, metrics

_ATTR = _storage.ATTR
_CACHE: dict = {}
_LAST_BY_OPS: dict = {}   # op sequence -> last key compiled for it (recompile reasons)
recompile_reasons = metrics.recompile_reasons
_DONATE = os.environ.get("TORCH_TPU_DONATE", "1") not in ("", "0")


def donations(ext, storages):
    """Indices of external buffers the graph overwrote and nothing else holds: donating
    them lets XLA write results in place (an optimizer step would otherwise hold old and
    new weights and state at once). Called once the pending nodes have dropped their
    inputs, so a buffer whose only reference left is `ext` belongs to nobody else: not to
    a live storage, not to an array a caller kept, not to a storage sharing it. XLA reuses
    a donated buffer only for an output of its size and dtype: one per output at most."""
    free = collections.Counter(getattr(st, _ATTR)[1:] for st in storages)
    out = []
    for j in range(len(ext)):
        b = ext[j]
        # references: the ext list, `b`, getrefcount's argument
        if sys.getrefcount(b) == 3:
            k = (b.size, b.dtype)
            if free[k] > 0:
                free[k] -= 1
                out.append(j)
    return tuple(out)


def _build(nodes, wiring, out_refs, next_):
    raws = [n.entry.raw for n in nodes]
    ndyn = [len(n.dyns) for n in nodes]
    names = [n.entry.key[0] for n in nodes]

    def fused(*args):
        ext, dyns = args[:next_], args[next_:]
        vals = []
        d = 0
        for raw, w, nd, name in zip(raws, wiring, ndyn, names):
            ins = [ext[x] if type(x) is int else vals[x[0]][x[1]] for x in w]
            try:
                vals.append(raw(*ins, *dyns[d:d + nd]))
            except Exception as e:  # name the op; the user's line is added by flush()
                raise _NodeError(len(vals), e) from e
            d += nd
        return [vals[a][b] for a, b in out_refs]

    return fused


def _explain(nodes, key):
    """Why a graph with the same ops as an earlier one compiled again."""
    ops = tuple(n.entry.key[0] for n in nodes)
    prev = _LAST_BY_OPS.get(ops)
    _LAST_BY_OPS[ops] = (key, [n.entry.key for n in nodes])
    if prev is None:
        return
    prev_key, prev_entries = prev
    for i, (a, b) in enumerate(zip(prev_entries, (n.entry.key for n in nodes))):
        if a != b:
            reason = f"op {i} ({a[0]}): arguments changed from {a[1]} to {b[1]}"
            break
    else:
        if prev_key[1] != key[1]:
            reason = "same ops, different data flow between them"
        elif prev_key[2] != key[2]:
            reason = "same ops, different set of values kept alive after the graph"
        else:
            reason = "scalar argument types changed"
    recompile_reasons.append(reason)
    metrics.count("fused_recompiles")


class _NodeError(Exception):
    def __init__(self, index, error):
        super().__init__(str(error))
        self.index = index
        self.error = error


def _user_line(where):
    return f"{where[0]}:{where[1]}"


def flush(nodes) -> None:
    # wire + choose outputs, in C (one pass each over the nodes); from here on only `ext`
    # holds the inputs
    wiring, ext, dyns, entries, dyn_types, out_refs, storages = _C.flush_plan(nodes)
    donate = donations(ext, storages) if _DONATE else ()
    key = (entries, wiring, out_refs, dyn_types, donate)  # the graph key
    fn = _CACHE.get(key)
    if fn is None:
        t0 = time.perf_counter()
        _explain(nodes, key)
        fn = jax.jit(_build(nodes, wiring, out_refs, len(ext)), donate_argnums=donate)
        _CACHE[key] = fn
        metrics.count("fused_graphs_compiled")
        metrics.compile_seconds[0] += time.perf_counter() - t0
    else:
        metrics.count("fused_cache_hits")
    metrics.count("fused_nodes", len(nodes))
    metrics.count("fused_donated_buffers", len(donate))
    try:
        results = fn(*ext, *dyns)
    except _NodeError as e:
        node = nodes[e.index]
        raise RuntimeError(
            f"{node.entry.key[0]} (recorded at {_user_line(node.frame)}) failed while "
            f"flushing a DeferAndFuse graph: {e.error}") from e.error
    for st, arr in zip(storages, results):
        rec = getattr(st, _ATTR)
        setattr(st, _ATTR, (arr, rec[1], rec[2]))
        _storage.realized(st)
    for node in nodes:  # break the node <-> Lazy cycles: refcounting frees them now
        node.frame = None
        node.outs = None

