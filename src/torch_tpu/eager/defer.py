"""DeferAndFuse eager mode, the recording half: ops become pending graph nodes.

Recording an op costs what Strict costs minus the XLA call: the argument scan and cache
lookup give the op's cached entry, whose result shapes and dtypes were worked out once per
(op, shapes, dtypes, statics); no device memory is touched. Each result's storage gets a
`Lazy` value in place of an XLA buffer; later ops read it like a buffer. `fuse.flush` turns
the pending nodes into one XLA program at a sync point.

Loop detection: a training loop that never syncs must still flush once per iteration, into
the same cached graph. The recorder keeps the entry ids recorded since the last flush; when
the newest 2P ops are one block of P ops repeated (and P is a large part of what was
recorded), it flushes, so each flush covers the same repeated ops.

Step boundary: the end of an optimizer step flushes. A training loop's graphs then begin
where its iterations do: the first iteration's backward-and-step graph is every later
iteration's, and so is its forward (else the first forward stands alone and every later
one joins the previous step: one more program, compiled at the second iteration).

Compile-cost guard: XLA compiles an unrolled loop's every step anew, and on XLA:CPU a
step with a matmul and an RNN cell costs ~0.2-0.5 s, so a 2-layer LSTM over 35 time steps
(forward, or backward: 20 ops a step) compiled for minutes as one graph. The detector's
size cap is used as a checkpoint (`loop.max_nodes`, GUARD_STEP nodes apart, or where a
block seen twice would have its repeats; the real cap is `max_nodes`, MAX_NODES), so
recording pays nothing per op: there the newest ops are searched (csrc/loop.cpp
repeated_block) for a block of P ops repeated GUARD_REPEATS times in a row that holds an
op XLA does not fuse into a loop (not pointwise). Found, the graph is flushed, and from
then on every GUARD_CHUNK nodes (a whole number of blocks) that are exactly the block
again are flushed alone: the same graph each time, one cached program. The first other
op ends that. Models of at most 5 identical layers and pointwise chains are never split;
backward passes are (their steps repeat like the forward's). docs/DYNAMIC_SHAPES.md,
"Cold start".

Python's cyclic garbage collector is paused while a graph is pending (if it was running)
and resumes at the flush. A small Llama step keeps ~2,500 recording objects alive until
its flush; collections that run meanwhile promote them to older generations, which then
fill up and force full collections of the whole heap (torch, jax, transformers: ~500K
objects): ~2.4 ms of a ~30 ms step. After the flush those objects are freed by reference
counting, so the paused collector has little left to do. Flushes come at least every
loop iteration or MAX_NODES ops, so the pause is short; nothing is lost, only delayed.

Threads: all threads in DeferAndFuse share one pending graph, as CUDA's threads share the
default stream: ops recorded by several threads run in the order they were recorded, and
a sync on any thread runs them all. `lock` (re-entrant) is held while an op records on
the Python path and for a whole flush, XLA's run included, during which `nodes` is None:
another thread's op cannot read the values of the graph that is being run before they
exist. The C recording path (csrc/kernel.cpp) does not take the lock: it holds the GIL
from its scan to its append, and leaves the op to `execute` (which waits on the lock)
when `nodes` is None, or when `nodes` is no longer the list it read before its scan (a
flush ran while a Python callback of the scan let other threads run).
"""
from __future__ import annotations

import contextlib
import gc
import threading
import weakref

import jax.numpy as jnp

from .. import _C, _frames, _on_import, _runtime, _storage, metrics
from .._program_cache import op_entry
from . import fuse
from .._C import Lazy, Node
from ..op import capacity, current
from ..op.build import Entry, run_eager
from ..op.opcall import device_scalar, scan_fast
from .strict import new_tensor

# The pending graph's two C types (csrc/graph.cpp), C because every recorded op makes a Node
# and a Lazy per result and the flush walks them all. Node(entry, bufs, dyns, frame): the
# op's cached build.Entry, its input buffers (jax arrays or Lazy values), its dynamic
# scalars, its (file, line); `outs` holds a Lazy per output and `pos` its index, set at
# the flush. Lazy(node, idx, owner): the flat buffer that output `idx` will be; `owner` is
# a weakref to the storage object whose buffer record holds it.
_ATTR = _storage.ATTR
# (file, line) of the first caller outside torch and torch_tpu (_frames.py), kept per node
_user_line = _frames.user_line
# appends the op's Node to the pending nodes and returns the op's result: new tensors whose
# storages hold the node's Lazy outputs; the storages it mutates get Lazy records too
_record = _C.record
_COUNTERS = metrics.counters
_slot = _C.slot

MAX_NODES = 4096       # graph-size cap: flush before a graph gets slow to compile
MIN_PERIOD = 10        # shortest op block that counts as a loop iteration
# the compile-cost guard (see the top)
GUARD_STEP = 16        # nodes between its checkpoints (further apart past 128: n // 4)
GUARD_REPEATS = 6      # a block repeated this often in a row is an unrolled loop
GUARD_MAX_BLOCK = 256  # the longest block looked for
# nodes flushed per chunk of blocks; under 2 * MIN_PERIOD, so that the loop detector
# never sees a chunk's blocks as loop iterations (a block of 10+ ops is a chunk alone)
GUARD_CHUNK = 16
DEFERRED_UPLOAD_MAX_BYTES = 4 << 20  # larger host uploads go at once (see `upload`)


class DeferExecutor:
    name = "defer_and_fuse"
    deferred = True
    # slots: the op kernels read nodes and in_backward at their offsets (csrc/slots.h)
    __slots__ = ("chunk", "device", "graphs", "in_backward", "lock", "loop", "max_nodes",
                 "nodes", "paused_gc")

    def __init__(self):
        self.nodes = []  # None while a flush runs (see the top: threads)
        self.lock = threading.RLock()
        self.paused_gc = False
        self.in_backward = 0  # backward passes running (see `backward`)
        # its size cap is the compile-cost guard's next checkpoint (see the top); it keeps
        # the pending nodes' entry ids, and which compile apart, for the guard's search
        self.loop = _C.LoopDetector(MIN_PERIOD, GUARD_STEP)
        self.max_nodes = MAX_NODES
        self.chunk = None  # the guard's chunk: the entries a graph of repeated blocks has
        self.graphs = set()  # ids of the compiled graphs (compile/program.py) pending
        self.device = 0  # the tpu index of the pending graph (several devices per process)

    def _graph_starts(self):
        """A graph's first node: pause the cyclic GC (see the top)."""
        if gc.isenabled():
            gc.disable()
            self.paused_gc = True

    # ------------------------------------------------------------ recording
    def execute(self, plan, vals):
        # The ops' kernels (csrc/kernel.cpp) do this in C when the entry is cached and
        # scan_fast covers the call, and come here for everything else.
        held = capacity.route(self.execute, plan, vals)  # a growing tensor's call
        if held is not capacity.PASS:
            return held
        with self.lock:
            if self.nodes and self.device != _slot():  # (before the scan: it draws seeds)
                self.flush("device")
            while True:
                nodes = self.nodes
                key, bufs, dyns = scan_fast(plan, vals) or plan.scan(vals)
                if self.nodes is nodes:
                    break
                # the scan's constant for a fresh storage reached the guard's checkpoint
                # and flushed: the values it scanned before are of the graph that ran
                # (as the C path, which comes here then); scan again
            entry = op_entry(plan, key, vals, False)
            _COUNTERS["dispatches.defer_and_fuse"] += 1
            if entry.fn is None:
                return self._run_now(plan, vals)
            out = _record(self._open_graph(), entry, bufs, dyns, vals)
            self._after_record(entry)
            return out

    def _open_graph(self):
        """The pending nodes to append to (the lock held)."""
        nodes = self.nodes
        if nodes is None:  # only this thread can be in its flush: the lock is ours
            raise RuntimeError("DeferAndFuse: an op was recorded while its own thread was "
                               "flushing the pending graph")
        device = _slot()
        if device != self.device:  # a graph never spans two devices
            if nodes:
                self.flush("device")
                nodes = self.nodes
            self.device = device
        if not nodes:
            self._graph_starts()
        return nodes

    def constant(self, storage, dtype, value=0):
        """Make the storage's whole buffer `value` (fill_/zero_ of all of it, or a fresh
        storage an op reads): a node with no inputs, so nothing is read or allocated
        before the flush, and a value nothing keeps never gets a buffer. -> its record."""
        jdt = _runtime.jax_dtype(dtype)
        n = storage.nbytes() // jdt.itemsize
        return self._source(storage, _constant_entry(n, jdt), device_scalar(value), n, jdt)

    def fill(self, storage, dtype, value) -> None:
        """fill_/zero_ of a whole storage: a pending constant (see `constant`)."""
        self.constant(storage, dtype, value)

    def upload(self, storage, src) -> None:
        """A contiguous CPU tensor's values become the whole storage's buffer. A small one
        is a node whose value is passed to the flushed program as an argument, so the
        transfer rides on the flush's XLA call (the first call after the device went
        idle costs ~0.3 ms, and a training step's batch upload is such a call). Large
        ones (weights moved once) go at once: a pending upload keeps its host copy until
        the flush. One made while no graph is pending goes at once too: a model's weights
        and a data set moved before the loop would otherwise make its first graph differ
        from every later one (one more program, compiled at the second iteration), and a
        step's batch upload, made after the previous step's flush, is such an upload on
        every iteration alike. A small integer one (an index list) takes its values' shared
        buffer (_storage.small_upload)."""
        buf = _storage.small_upload(src)
        if buf is not None:
            _storage.set_buffer(storage, buf)
            return
        if not self.nodes or not 0 < src.numel() * src.element_size() <= DEFERRED_UPLOAD_MAX_BYTES:
            _storage.set_buffer(storage, _runtime.to_device(src))
            return
        host = _runtime.host_array(src)
        jdt = _runtime.jax_dtype(src.dtype)
        self._source(storage, _upload_entry(host.shape[0], jdt), host, host.shape[0], jdt)

    def graph(self, program, args):
        """A compiled graph's call records (record_graph); one already pending flushes first:
        a training loop flushes once per step (its graphs and eager ops: one program)."""
        with self.lock:  # (threads: as an eager op's recording)
            if id(program) in self.graphs:
                self.flush("compiled_repeat")
            self.graphs.add(id(program))
            return program.call(args, self)

    def record_graph(self, entry, bufs, dyns, outs) -> None:
        """A compiled graph's call as one node (the lock held since `graph`); `outs`:
        the (storage, length, jax dtype) that its results become, in order."""
        node = Node(entry, bufs, dyns, _user_line())
        self._open_graph().append(node)
        for i, (st, n, jdt) in enumerate(outs):
            lazy = Lazy(node, i, weakref.ref(st))
            node.outs.append(lazy)
            setattr(st, _ATTR, (lazy, n, jdt))
        _COUNTERS["dispatches.compiled_graphs"] += 1
        self._after_record(entry)

    @contextlib.contextmanager
    def backward(self):
        """Flush the forward graph, so the device runs it while the backward records (not
        a compiled forward: its backward records in microseconds, and joins it); the
        loop detector ignores the repetition of layers within the backward pass."""
        if not self.graphs:
            self.flush("backward")
        self.in_backward += 1
        try:
            yield
        finally:
            self.in_backward -= 1

    def _source(self, storage, entry, dyn, n, jdt):
        """A node with no inputs and one dynamic argument, whose output is the storage's
        new buffer."""
        node = Node(entry, [], [dyn], _user_line())
        with self.lock:
            self._open_graph().append(node)
            lazy = Lazy(node, 0, weakref.ref(storage))
            node.outs.append(lazy)
            rec = (lazy, n, jdt)
            setattr(storage, _ATTR, rec)
            _COUNTERS["dispatches.defer_and_fuse"] += 1
            self._after_record(entry)
        return rec

    def _run_now(self, plan, vals):
        """Data-dependent shapes (nonzero, ...): flush, then run the op on concrete values."""
        self.flush("data_dependent")
        _COUNTERS["defer.ran_at_once"] += 1
        key, bufs, dyns = plan.scan(vals)
        entry = op_entry(plan, key, vals, False)
        fresh, outs = run_eager(plan, entry, vals, bufs, dyns)
        tensors = [new_tensor(s, d, f) for (s, d, _), f in zip(fresh, outs)]
        return tensors[0] if len(tensors) == 1 else tuple(tensors)

    def _after_record(self, entry):
        verdict = self.loop.push(id(entry), self.in_backward, _compiles_apart(entry))
        if verdict:
            self._loop_flush(verdict)

    def _loop_flush(self, verdict):
        """The loop detector's verdict: 1, a loop iteration ended; 2, its size cap: the
        compile-cost guard's checkpoint, or the graph-size cap."""
        if verdict == 1:
            metrics.count("loops_detected")
            self.flush("loop")
        elif not self._guard():
            self.flush("size_cap")

    def _guard(self) -> bool:
        """The compile-cost guard's checkpoint (see the top); False: the graph reached
        its size cap."""
        with self.lock:
            nodes = self.nodes
            if not nodes:  # (another thread flushed it meanwhile)
                return True
            n = len(nodes)
            if n >= self.max_nodes:
                return False
            chunk = self.chunk
            if chunk is not None:
                if n == len(chunk) and all(a.entry is b for a, b in zip(nodes, chunk)):
                    self.flush("compile_guard")
                    return True
                self.chunk = None  # the loop ended
            else:
                p, soon = self.loop.repeated_block(GUARD_REPEATS, GUARD_MAX_BLOCK)
                if p:
                    block = [nd.entry for nd in nodes[n - p:]]
                    self.chunk = tuple(block * max(1, GUARD_CHUNK // p))
                    self.flush("compile_guard")
                    return True
                if soon:  # look again where a block seen twice will have its repeats
                    self.loop.max_nodes = min(self.max_nodes, n + soon)
                    return True
            self.loop.max_nodes = min(self.max_nodes, n + max(GUARD_STEP, n >> 2))
            return True

    # ------------------------------------------------------------ flushing
    def flush(self, reason: str) -> None:
        with self.lock:  # (other threads' ops wait: see the top)
            nodes = self.nodes
            if not nodes:
                return
            self.nodes = None
            self.loop.reset()
            self.graphs.clear()
            if reason != "compile_guard":
                self.chunk = None
            # the next graph: the guard's chunk, or its first checkpoint
            self.loop.max_nodes = min(self.max_nodes,
                                      len(self.chunk) if self.chunk else GUARD_STEP)
            metrics.count(f"flush.{reason}")
            try:
                if self.device == _slot():
                    fuse.flush(nodes)
                else:  # (an op on another device flushes this one's graph)
                    with _runtime.on_device(self.device):
                        fuse.flush(nodes)
            finally:
                self.nodes = []
                del nodes
                if self.paused_gc:
                    self.paused_gc = False
                    gc.enable()


def _flush_after_step(optimizer, args, kwargs):
    """torch's global hook after every Optimizer.step: the step boundary (see the top)."""
    ex = current.executor()
    if isinstance(ex, DeferExecutor):
        ex.flush("optimizer_step")


def _hook_optimizer_steps():
    import torch.optim.optimizer as optimizer

    optimizer.register_optimizer_step_post_hook(_flush_after_step)


# (torch.optim may still be loading when torch's device autoload imports torch_tpu)
_on_import.when_imported("torch.optim.optimizer", _hook_optimizer_steps,
                         lambda m: hasattr(m, "register_optimizer_step_post_hook"))


def _compiles_apart(entry) -> bool:
    """An aten op that is not pointwise (OpPlan.apart; the ops' C kernels read it too):
    its own kernel in XLA's program (a matmul, an RNN cell, a reduction), which is what a
    long graph's compile time is made of. Sources (constants, uploads) are not."""
    return getattr(entry.key[0], "apart", False)


_SOURCES: dict = {}


def _source_entry(kind, n, jdt, make_raw):
    """The cached entry of a flat buffer of n elements made from one dynamic argument;
    `make_raw(n, jdt)` gives its traceable body (built on a miss only)."""
    slot = _slot()  # (a graph's key names its entries: each device's graphs are its own)
    entry = _SOURCES.get((kind, n, jdt, slot))
    if entry is None:
        entry = Entry(None, [((n,), _runtime.torch_dtype(jdt), None)], (("fresh",),), [])
        entry.raw = make_raw(n, jdt)
        entry.key = (f"tpu::{kind}", ((n,), str(jdt)) if not slot else ((n,), str(jdt), slot))
        _SOURCES[(kind, n, jdt, slot)] = entry
    return entry


def _fill(n, jdt):
    return lambda v: [jnp.full((n,), v, jdt)]


def _as_is(n, jdt):
    return lambda host: [host]


def _constant_entry(n, jdt):
    """The cached entry of a constant flat buffer of n elements (the value is a dynamic
    scalar, so one graph serves any fill value)."""
    return _source_entry("constant", n, jdt, _fill)


def _upload_entry(n, jdt):
    """The cached entry of a host upload of n elements: the program's argument is the
    value."""
    return _source_entry("upload", n, jdt, _as_is)
