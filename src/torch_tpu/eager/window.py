"""Strict's compile window: new programs compile on worker threads while the ops after
them are traced.

A Strict op whose program is new costs its trace and lowering (Python, holding the GIL),
then XLA's compile (C++, GIL released). Run at its call, each op does both before the
next op starts, so a first step keeps one core busy: the small Llama's first step (78
new programs) used 3.9 s of CPU in 3.4 s of wall time on two cores.

So when Strict meets an op with no program (`open`), this executor takes the process's
ops until the next sync. It records them as DeferAndFuse does (their results are
pending Lazy values, csrc/graph.cpp), and starts each new program's XLA compile on a
worker thread at once (_program_cache.compile_ahead), for the avals its inputs will
have; the recording thread goes on tracing the next ops. The flush runs the recorded ops
in their order, each by its own program: Strict's executables, nothing fused, so the
programs, values and counts are Strict's own. Then Strict's C fast path takes over again.

The window closes at whatever flushes DeferAndFuse (a host read, synchronize, a mode
change, a capture, torch.compile's graphs, data-dependent shapes), after WARM_RUN ops in
a row that had a program (a loop past its first iteration goes back to the fast path),
or at MAX_NODES. Constants, fills and uploads
stay Strict's (at once). Only the process-wide Strict executor opens a window, while no
eager_mode block is open (TORCH_TPU_COMPILE_WINDOW=0: never).

Errors: a bad call raises at the call, as in Strict (its trace runs there). An error of
the run itself (out of memory) raises at the flush, naming the op and the line it was
called from, as Strict's asynchronous errors surface at the next sync.
"""
from __future__ import annotations

import collections
import threading

import jax

from .. import _C, _config, _frames, _runtime, _storage, metrics
from .._program_cache import op_entry
from ..op import asserts, capacity, current
from ..op.opcall import scan_fast

_COUNTERS = metrics.counters
_ATTR = _storage.ATTR
_UNSET = (None,)
_ENABLED = _config.get("TORCH_TPU_COMPILE_WINDOW")
WARM_RUN = 256     # ops in a row with a program: the window closes
MAX_NODES = 4096   # ops held at most (their inputs stay alive until the flush)


class CompileWindow:
    """The executor interface (op/current.py) for Strict while new programs compile."""

    name = "strict"
    deferred = False  # new storages get their buffers at once, as in Strict
    counter = "dispatches.strict"

    def __init__(self, strict):
        self.strict = strict
        self.nodes = []
        self.committed = {}  # id(node) -> whether its results will be committed arrays
        self.warm = 0  # ops in a row recorded with a program
        self.lock = threading.RLock()  # recording and the whole flush: one thread at a time
        self.is_open = False

    # ------------------------------------------------------------ opening
    def open(self, entry, bufs, dyns, vals):
        """Strict's call of an op whose program is new (entry.ahead set): the window opens
        with it, and -> its result; None where no window may open."""
        if not _ENABLED:
            return None
        with self.lock:
            if self.is_open or not current.swap_global(self.strict, self, outside_blocks=True):
                return None
            self.is_open = True
            _COUNTERS["window.opened"] += 1
            return self._record(entry, bufs, dyns, vals)

    # ------------------------------------------------------------ recording
    def execute(self, plan, vals):
        held = capacity.route(self.execute, plan, vals)  # a growing tensor's call
        if held is not capacity.PASS:
            return held
        with self.lock:
            if not self.is_open:  # closed while this thread waited for the lock
                return self.strict.execute(plan, vals)
            key, bufs, dyns = scan_fast(plan, vals) or plan.scan(vals)
            entry = op_entry(plan, key, vals, True)
            _COUNTERS[self.counter] += 1
            if entry.fn is None:  # data-dependent shapes: run on values
                self.flush("data_dependent")
                return self.strict.execute(plan, vals)
            out = self._record(entry, bufs, dyns, vals)
            if self.warm >= WARM_RUN or len(self.nodes) >= MAX_NODES:
                self.flush("window_full" if self.warm < WARM_RUN else "window_warm")
            return out

    def _record(self, entry, bufs, dyns, vals):
        committed = self.committed
        is_committed = _commits(entry, bufs, dyns, committed)
        if entry.ahead is not None:
            self.warm = 0
            specs = _specs(entry, bufs, dyns, committed)
            if specs is not None:
                entry.ahead(specs)
        else:
            self.warm += 1
        out = _C.record(self.nodes, entry, bufs, dyns, vals)
        committed[id(self.nodes[-1])] = is_committed
        return out

    # ------------------------------------------------------------ Strict's, at once
    def constant(self, storage, dtype, value=0):
        return self.strict.constant(storage, dtype, value)

    def fill(self, storage, dtype, value) -> None:
        self.strict.fill(storage, dtype, value)

    def upload(self, storage, src) -> None:
        self.strict.upload(storage, src)

    def graph(self, program, args):
        """A compiled graph's call: the window's ops first, then it runs now."""
        self.flush("compiled_graph")
        return self.strict.graph(program, args)

    def backward(self):
        return self.strict.backward()

    # ------------------------------------------------------------ flushing
    def flush(self, reason: str) -> None:
        """Run the recorded ops, each by its own program, in order; close the window."""
        with self.lock:
            if not self.is_open:
                return
            nodes, self.nodes, self.warm = self.nodes, [], 0
            self.committed = {}
            try:
                if nodes:
                    _COUNTERS[f"flush.{reason}"] += 1
                    _COUNTERS["window.ops"] += len(nodes)
                    _run(nodes)
            finally:
                self.is_open = False
                current.swap_global(self, self.strict)


def _run(nodes) -> None:
    """Each node's program on its inputs (arrays, or earlier nodes' results); each result
    a storage still holds becomes its buffer. A result is dropped once its last reader ran."""
    readers = collections.Counter(id(b) for node in nodes for b in node.bufs
                                  if type(b) is _C.Lazy)
    values: dict = {}
    storages, buffers = [], []
    try:
        for node in nodes:
            ins = []
            for b in node.bufs:
                if type(b) is _C.Lazy:
                    i = id(b)
                    ins.append(values[i])
                    readers[i] -= 1
                    if not readers[i]:
                        del values[i]
                else:
                    ins.append(b)
            # (an input overwritten meanwhile, as an optimizer's parameters are, is freed
            # once read, as in Strict, not at the end of the flush)
            node.bufs = ()
            entry = node.entry
            try:
                if entry.checks is None:
                    outs = entry.fn(*ins, *node.dyns)
                else:  # an op with index arguments: linked into the device-side asserts' chain
                    outs = asserts.run_strict(entry, ins, node.dyns, node.frame)
            except Exception as e:
                where = f"{entry.key[0]} (called at {_frames.location(*node.frame)})"
                if isinstance(e, jax.errors.JaxRuntimeError):
                    _runtime.raise_if_out_of_memory(e, where)
                e.add_note(f"torch_tpu: raised by {where}, run at the next sync while its "
                           "program compiled (Strict's compile window)")
                raise
            for lazy in node.outs:
                v = outs[lazy.idx]
                st = lazy.owner()
                if st is not None and getattr(st, _ATTR, _UNSET)[0] is lazy:
                    storages.append(st)
                    buffers.append(v)
                if readers.get(id(lazy)):
                    values[id(lazy)] = v
    finally:
        _C.replace_buffers(storages, None, buffers)
        _C.release(nodes)


def _commits(entry, bufs, dyns, committed) -> bool:
    """Whether the entry's results will be committed to the device, which jit's cache keys
    their readers' programs by: when an argument its program keeps is (weights are; an
    arange's results, or normal_'s, which reads nothing, are not). The device-side
    asserts' chain value, its last argument, is. (No kept arguments known: an entry not
    traced by OpPlan, whose results have no avals, so no reader compiles ahead.)"""
    kept = entry.kept
    if kept is None:
        return True
    if entry.checks is not None and kept[-1]:
        return True
    return any(committed.get(id(a.node), True) if type(a) is _C.Lazy
               else getattr(a, "committed", False)
               for a, k in zip((*bufs, *dyns), kept) if k)


def _specs(entry, bufs, dyns, committed):
    """What the entry's program will be called with: the arrays, and for each pending
    input its aval, on the device if committed (None: not known, and its first call
    compiles)."""
    on_device = jax.sharding.SingleDeviceSharding(_runtime.device())
    specs = []
    for b in bufs:
        if type(b) is _C.Lazy:
            avals = b.node.entry.out_avals
            if avals is None:
                return None
            a = avals[b.idx]
            b = jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                     sharding=on_device if committed.get(id(b.node), True)
                                     else None)
        specs.append(b)
    specs.extend(dyns)
    if entry.checks is not None:
        if not asserts.enabled():
            return None  # its call runs another program (asserts.run_strict)
        specs.extend(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_device)
                     for a in asserts.LINK_SHAPES)
    return specs

