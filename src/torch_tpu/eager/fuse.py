"""DeferAndFuse, the flush pipeline: pending nodes -> one cached XLA program -> buffers.

Steps:
  plan            (C: _C.flush_plan, one pass over the nodes) number the nodes; map every
                  input to an external buffer or a node output; keep as outputs only the
                  values a live storage still holds (dead intermediates never get a buffer);
                  pick the external buffers the graph overwrote and nobody else holds,
                  to donate (XLA writes results in place: peak memory)
  graph key       op entries + wiring + outputs + scalar slots and types + donations, as
                  bytes: tensor data and scalar values are parameters, so a changing
                  learning rate does not recompile. Equal scalars (one cached object per
                  value) are passed once, which slots share one is in the key (AdamW's
                  per-parameter lists repeat one bias correction: 300 slots, 15 values);
                  integers (offsets passed as data, lengths, seeds) are passed per slot,
                  since equal ones coincide by chance
  lookup/compile  one jax.jit per key; a miss explains what differed from the last graph
                  with the same ops (the recompile reason in metrics). A miss that only
                  shares more scalars than a compiled graph (values that happened to be
                  equal: two positions, a schedule crossing a constant) runs that graph,
                  passing the shared scalar to each of its slots; a miss that shares
                  differently compiles the graph that shares only what both share, once
                  (`_sharing`; counted as fused_graphs_shared_scalars)
  run, write back the results become the storages' buffers
"""
from __future__ import annotations

import array
import time

import jax

from .. import _C, _config, _frames, _runtime, _storage, metrics
from .._program_cache import admit_graph
from ..op import asserts
from . import forward

_CACHE: dict = {}
_CACHE_UNCHECKED: dict = {}  # the graphs compiled with TORCH_TPU_DEVICE_ASSERTS=0
_LAST_BY_OPS: dict = {}   # op sequence -> last key compiled for it (recompile reasons)
recompile_reasons = metrics.recompile_reasons
_DONATE = _config.get("TORCH_TPU_DONATE")


# The graph key's layout (csrc/graph.cpp flush_plan; tests/unit/test_c_contracts.py checks these
# against _C.CONTRACTS["key_layout"]): int64 words; a node output is (node << _OUT_BITS |
# output); the node records (entry id, n_inputs, inputs...), then counted sections.
_OUT_BITS = 20
_KEY_SECTIONS = ("nodes", "outputs", "dyn_slots", "dyn_types", "donated")


def _decode(key):
    """The graph key (csrc/graph.cpp flush_plan) -> (wiring, out_refs, dyn slots, dyn
    types, donated): per node its inputs, each an ext index or a (node, output) pair;
    the index of each node scalar (in node order) among the distinct ones passed."""
    a = memoryview(key).cast("q")
    pos = 1
    wiring = []
    for _ in range(a[0]):
        nb = a[pos + 1]
        ins = a[pos + 2:pos + 2 + nb]
        wiring.append(tuple(x if x >= 0 else divmod(~x, 1 << _OUT_BITS) for x in ins))
        pos += 2 + nb
    parts = []
    for _ in _KEY_SECTIONS[1:]:
        n = a[pos]
        parts.append(tuple(a[pos + 1:pos + 1 + n]))
        pos += 1 + n
    outs, dyn_slots, dyn_types, donated = parts
    outs = tuple(divmod(o, 1 << _OUT_BITS) for o in outs)
    return tuple(wiring), outs, dyn_slots, dyn_types, donated


def _build(nodes, wiring, out_refs, dyn_slots, next_, checked=()):
    """A checked node's raw takes the device-side asserts' chain value last and returns the
    chain's new value last (op/asserts.py); `checked`, the positions of those nodes
    when asserts are on, makes the graph take the chain as its last argument, pass it
    through them in order and return it last. (Off: a zero, and the codes are dead.)"""
    raws = [n.entry.raw for n in nodes]
    ndyn = [len(n.dyns) for n in nodes]
    linked = [n.entry.checks is not None for n in nodes]
    # each node's ops carry its aten op's name (XLA op metadata: device profiles show it)
    names = [str(n.entry.key[0]) for n in nodes]

    def fused(*args):
        ext, dyns = args[:next_], args[next_:]
        chain = (args[-1],) if checked else asserts.unlinked()
        vals = []
        d = 0
        with _storage.forwarding():  # a view read back as a write left it (forward.py)
            for raw, w, nd, name, link in zip(raws, wiring, ndyn, names, linked):
                ins = [ext[x] if type(x) is int else vals[x[0]][x[1]] for x in w]
                extra = chain if link else ()
                try:
                    with jax.named_scope(name):
                        vals.append(raw(*ins, *[dyns[j] for j in dyn_slots[d:d + nd]], *extra))
                except Exception as e:  # name the op; the user's line is added by flush()
                    raise _NodeError(len(vals), e) from e
                d += nd
                if link and checked:
                    chain = (vals[-1][-1],)
        outs = [vals[a][b] for a, b in out_refs]
        if checked:
            outs.append(chain[0])
        return outs

    return fused


def _explain(nodes, parts):
    """Why a graph with the same ops as an earlier one compiled again. `parts`: the
    decoded key (wiring, outputs, scalar slots, scalar types, donated buffers)."""
    ops = tuple(n.entry.key[0] for n in nodes)
    prev = _LAST_BY_OPS.get(ops)
    _LAST_BY_OPS[ops] = (parts, [n.entry.key for n in nodes])
    if prev is None:
        return None
    prev_parts, prev_entries = prev
    for i, (a, b) in enumerate(zip(prev_entries, (n.entry.key for n in nodes))):
        if a != b:
            reason = f"op {i} ({a[0]}): arguments changed from {a[1]} to {b[1]}"
            break
    else:
        if prev_parts[0] != parts[0]:
            reason = "same ops, different data flow between them"
        elif prev_parts[1] != parts[1]:
            reason = "same ops, different set of values kept alive after the graph"
        elif prev_parts[2] != parts[2]:
            reason = ("same ops, scalar arguments equal in value differently (scalars of "
                      "equal value are passed once)")
        elif prev_parts[3] != parts[3]:
            reason = "scalar argument types changed"
        else:
            reason = "same ops, different input buffers free to donate"
    recompile_reasons.append(reason)
    metrics.count("fused_recompiles")
    return reason


_FINEST: dict = {}  # key less its scalar sharing -> (key, decoded parts) of the graph to share
_SHARED: dict = {}  # a key run by another graph -> (that graph's key, its scalars' picks)


def _loose(key, parts):
    """The key without which scalar slots share a value: the nodes, outputs and donations
    as they are, and each slot's own type."""
    a = memoryview(key).cast("q")
    _, outs, dyn_slots, dyn_types, donated = parts
    pos = 1
    for _ in range(a[0]):
        pos += 2 + a[pos + 1]
    head = bytes(a[:pos + 1 + len(outs)])
    return head, tuple(dyn_types[j] for j in dyn_slots), donated


def _sharing(cache, key, parts):
    """(the key to run, its decoded parts, per scalar that graph takes which of ours, or
    None for all of ours as they are). Two keys of one graph may differ only in which
    scalar slots share a value; then the graph whose slots share only where both keys
    share serves both: the compiled one when it already is that graph, else that graph,
    to compile once, in place of a graph per pattern of coincidences."""
    loose = _loose(key, parts)
    known = _FINEST.get(loose)
    if known is None or known[0] not in cache:
        return key, parts, None
    known_key, known_parts = known
    labels: dict = {}  # (its scalar, ours) -> the scalar the joint graph takes
    slots = tuple(labels.setdefault(pair, len(labels))
                  for pair in zip(known_parts[2], parts[2]))
    if len(labels) == len(set(parts[2])):  # ours shares nothing the compiled one does not
        return key, parts, None
    pick = tuple(c for _, c in labels)
    if slots == known_parts[2]:
        return known_key, known_parts, pick
    types = tuple(parts[3][c] for c in pick)
    words = array.array("q", memoryview(key).cast("q")[:len(loose[0]) // 8])
    for section in (slots, types, parts[4]):
        words.append(len(section))
        words.extend(section)
    return words.tobytes(), (*parts[:2], slots, types, parts[4]), pick


def _remember(cache, key, parts) -> None:
    """A compiled graph is the one to share when it shares fewer scalars than the last
    (or the last was evicted)."""
    loose = _loose(key, parts)
    known = _FINEST.get(loose)
    if known is None or known[0] not in cache or len(set(parts[2])) > len(set(known[1][2])):
        _FINEST[loose] = (key, parts)


class _NodeError(Exception):
    def __init__(self, index, error):
        super().__init__(str(error))
        self.index = index
        self.error = error


def flush(nodes) -> None:
    _runtime.check_not_forked()  # (a forked child's XLA may hang: raise instead)
    # wire, choose outputs and donations, key the graph: in C, one pass over the nodes;
    # from here on only `ext` holds the inputs
    key, ext, dyns, storages, donate = _C.flush_plan(nodes, _DONATE)
    key = forward.alias(nodes, key, dyns, _decode)  # equal offsets of a write and its read
    checking = asserts.enabled()  # off: the same graphs without the code (dead in XLA)
    cache = _CACHE if checking else _CACHE_UNCHECKED
    hit = cache.get(key)
    pick = None
    if hit is None and key in _SHARED:
        joint, pick = _SHARED[key]
        hit = cache.get(joint)
        if hit is None:  # that graph was evicted
            del _SHARED[key]
    if hit is None:
        key_, parts, pick = _sharing(cache, key, _decode(key))
        if pick is not None:
            _SHARED[key] = (key_, pick)
            metrics.count("fused_graphs_shared_scalars")
            key, hit = key_, cache.get(key_)
    if hit is None:
        t0 = time.perf_counter()
        wiring, out_refs, dyn_slots, _, _ = parts
        reason = None
        if checking:  # (asserts off: a second set of graphs, not a recompile)
            reason = _explain(nodes, parts)
        checked = asserts.checked_nodes(nodes) if checking else ()
        # the graph's jit, named, bounded (LRU), timed and dumped by _program_cache
        fn = admit_graph(cache, key, nodes,
                         _build(nodes, wiring, out_refs, dyn_slots, len(ext), checked),
                         donate, reason)
        # the key names entries by id: holding them keeps the ids theirs
        cache[key] = hit = (fn, [n.entry for n in nodes], checked)
        _remember(cache, key, parts)
        metrics.count("fused_graphs_compiled")
        metrics.compile_seconds[0] += time.perf_counter() - t0
    else:
        metrics.count("fused_cache_hits")
    metrics.count("fused_nodes", len(nodes))
    metrics.count("fused_donated_buffers", len(donate))
    if pick is not None:  # a graph that shares fewer scalars: each of its is one of ours
        dyns = [dyns[j] for j in pick]
    try:
        if hit[2]:  # checked nodes: linked into the device-side asserts' chain
            results = asserts.run_graph(hit[0], (*ext, *dyns), nodes, hit[2])
        else:
            results = hit[0](*ext, *dyns)
    except _NodeError as e:
        node = nodes[e.index]
        raise RuntimeError(
            f"{node.entry.key[0]} (recorded at {_frames.location(*node.frame)}) failed while "
            f"flushing a DeferAndFuse graph: {e.error}") from e.error
    except jax.errors.JaxRuntimeError as e:
        _runtime.raise_if_out_of_memory(
            e, f"running a DeferAndFuse graph of {len(nodes)} ops recorded from "
               f"{_frames.location(*nodes[0].frame)} to {_frames.location(*nodes[-1].frame)}")
        raise
    _C.replace_buffers(storages, None, results)
    _C.release(nodes)  # break the node <-> Lazy cycles: refcounting frees them now
