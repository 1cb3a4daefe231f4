"""Strict eager: every op runs at once as one cached XLA executable, asynchronously.

Dispatch never waits for a result; only reading values on the host (`.item()`, `.cpu()`,
print) does. While new programs compile, the ops after them are traced meanwhile and run
at the next sync, each by its own program (the compile window: eager/window.py).
"""
from __future__ import annotations

import contextlib
import sys

import jax

from .. import _C, _jax_internals, _runtime, _storage, metrics
from .._program_cache import op_entry
from .._transfer import covers_storage
from ..op import asserts, capacity, lengths  # noqa: F401  (lengths registers its calls)
from ..op.build import run_eager
from ..op.opcall import normalize, scan_fast

_COUNTERS = metrics.counters
_slot = _C.slot  # several devices per process: the op's tpu index


_ATTR = _storage.ATTR
_ARRAY = _jax_internals.ArrayImpl
IN_PLACE_MIN_BYTES = 1 << 20  # smaller: a new buffer costs less than a program of its own
_SOLE = 3  # sys.getrefcount of a buffer only its storage's record holds (+ a local, the call)
_empty = _C.empty_with_storage  # (shape, strides or None, dtype) -> (tensor, its storage)
# (structure, vals, fresh) -> what the op returns: per schema return, a fresh tensor, an
# argument it aliases (in-place ops), a list of fresh tensors, or a static value
assemble = _C.assemble


def new_tensor(shape, dtype, flat, rec=None, strides=None):
    """A tpu tensor owning `flat` (laid out in the memory order of `strides`; None:
    contiguous). Outside DeferAndFuse the allocator already counts the new storage as
    device memory."""
    t, st = _empty(shape, strides, dtype)
    if rec is None:
        _storage.set_buffer(st, flat)
    else:
        setattr(st, _ATTR, (flat, rec[0], rec[1]))
    return t


def finish(plan, entry, vals, outs, made):
    """Store results: `made` (the fresh outputs' (tensor, storage) pairs) get their buffers,
    mutated storages new ones."""
    nfresh = len(entry.fresh)
    fresh = []
    for (t, st), flat, rec in zip(made, outs, entry.out_recs):
        setattr(st, _ATTR, (flat, rec[0], rec[1]))
        fresh.append(t)
    for (i, j), flat in zip(entry.mut_slots, outs[nfresh:]):
        t = vals[i] if j is None else vals[i][j]
        _storage.set_buffer(t.untyped_storage(), flat)
    return assemble(entry.structure, vals, fresh)


class StrictExecutor:
    """Each op runs at once; nothing is deferred.

    The interface every executor answers (op/current.py): `execute` an op, `flush`
    what is deferred, make a whole storage a `constant` (a fresh storage's zeros) or
    `fill` it (fill_/zero_ of all of it: counted as an op), `upload` a host tensor into
    it, and a `backward` context around a backward() call."""

    name = "strict"
    deferred = False  # whether storages made now start without a buffer (eager/modes.py)
    counter = "dispatches.strict"
    # eager/window.py: the ops after a new program, while it compiles (Debug: None)
    window = None

    def flush(self, reason: str) -> None:
        """Nothing is deferred, but a compile window may be open (eager/window.py)."""
        if self.window is not None:
            self.window.flush(reason)

    def graph(self, program, args):
        """A compiled graph's call (compile/program.py): it runs now."""
        return program.call(args, None)

    def backward(self):
        return contextlib.nullcontext()

    def constant(self, storage, dtype, value=0):
        """The storage's whole buffer becomes `value`. -> its record."""
        jdt = _runtime.jax_dtype(dtype)
        n = storage.nbytes() // jdt.itemsize
        _storage.set_buffer(storage, _storage.constant(n, jdt, value), n, jdt)
        return getattr(storage, _ATTR)

    def fill(self, storage, dtype, value) -> None:
        """fill_/zero_ of a whole storage (torch.zeros/ones/full are empty + fill_): one
        XLA call that reads nothing (an op of the mode), or a small constant made before,
        a dict lookup counted as `fills.shared` (_storage.shared)."""
        jdt = _runtime.jax_dtype(dtype)
        n = storage.nbytes() // jdt.itemsize
        buf = _storage.shared(n, jdt, value)  # the hot case: one lookup, no second in constant
        _COUNTERS[self.counter if buf is None else "fills.shared"] += 1
        _storage.set_buffer(storage, _storage.constant(n, jdt, value) if buf is None else buf,
                            n, jdt)

    def upload(self, storage, src) -> None:
        """A contiguous CPU tensor's values become the whole storage's buffer (a small
        integer one's shared by value: _storage.small_upload)."""
        buf = _storage.small_upload(src)
        _storage.set_buffer(storage, _runtime.to_device(src) if buf is None else buf)

    def write_in_place(self, plan, dst, src) -> bool:
        """copy_ (`plan`) of `src` into part of a buffer of IN_PLACE_MIN_BYTES or more that
        only dst's storage holds (`x[a:b] = y`, an out= into a view): the buffer is donated
        to XLA, which writes the part in place, instead of a new buffer of the whole's size
        (XLA's buffers are immutable). TRL's chunked log-prob writes a (tokens, 16) corner
        of a (tokens, 32768) `torch.empty` so, three times a GRPO step: 23 MB made anew
        each time, ~4.8 ms a write on XLA:CPU (in place: 0.25 ms). Its program is the
        op's, keyed apart (op_entry's `donate`). False: not such a call (it runs as any op). DebugExecutor:
        None (every op keeps its checks)."""
        st = dst.untyped_storage()
        if (st.nbytes() < IN_PLACE_MIN_BYTES or src.untyped_storage() is st
                or dst.shape != src.shape or dst.dtype != src.dtype or dst.device != src.device
                or dst.is_conj() or dst.is_neg() or covers_storage(dst)):
            return False
        rec = getattr(st, _ATTR, None)
        if rec is None:  # a fresh storage: its zeros, as its first op would make them
            rec = self.constant(st, dst.dtype)
        if type(rec[0]) is not _ARRAY:
            return False
        buf = rec[0]
        if sys.getrefcount(buf) != _SOLE:  # another holder: a shared fill, a captured graph,
            return False                   # a pending node
        self.execute(plan, normalize(plan, (dst, src), {}), donate=True)
        # (XLA copies instead where the buffer has an external reference: a numpy view)
        _COUNTERS["writes_in_place" if buf.is_deleted() else "writes_in_place.copied"] += 1
        return True

    def execute(self, plan, vals, donate=False):
        held = capacity.route(self.execute, plan, vals)  # a growing tensor's call
        if held is not capacity.PASS:
            return held
        key, bufs, dyns = scan_fast(plan, vals) or plan.scan(vals)
        # the cached entry, or a new one (bounded LRU, precision, cache-only: _program_cache)
        entry = op_entry(plan, key, vals, True, donate)
        _COUNTERS[self.counter] += 1
        # a new program (its window runs at the next sync on tpu:0's programs only)
        if entry.ahead is not None and self.window is not None and not donate and not _slot():
            out = self.window.open(entry, bufs, dyns, vals)
            if out is not None:
                return out
        if entry.fn is None:
            fresh, outs = run_eager(plan, entry, vals, bufs, dyns)
            tensors = [new_tensor(s, d, f) for (s, d, _), f in zip(fresh, outs)]
            return tensors[0] if len(tensors) == 1 else tuple(tensors)
        # the results' storages first: past the device's capacity the allocator raises
        # torch.OutOfMemoryError before XLA allocates anything (_memory.py)
        made = [_empty(shape, strides, dtype) for shape, dtype, strides in entry.fresh]
        try:
            if entry.checks is None:
                outs = entry.fn(*bufs, *dyns)
            else:  # an op with index arguments: linked into the device-side asserts' chain
                outs = asserts.run_strict(entry, bufs, dyns)
        except jax.errors.JaxRuntimeError as e:
            _runtime.raise_if_out_of_memory(e, plan.name)
            raise
        return finish(plan, entry, vals, outs, made)
