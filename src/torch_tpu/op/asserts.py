"""Device-side asserts, as CUDA has them: an index out of range raises at the next
synchronization, naming the op and the user's line that issued it.

XLA never faults on a bad index (a gather clamps it, a scatter drops it, `jnp.take` fills
NaN), so a lowering declares its index arguments beside its rule (lowering/bounds.py) and
its program computes, beside its results, one int32 *code*: 0 when every index is in range,
else 1 + the first declared bound that is not (`op_code`). The torch.compile backend does
not check; Debug reads the indices on the host before each op and raises at the call.

The codes of successive checked ops form a *chain* on the device: a checked op's program
also takes the chain's latest value and returns its new value (`fold`), one int64 that
counts the ops linked so far (high 32 bits) and keeps the first nonzero code, tagged with
its op's position in the chain (low 32 bits: position * _SLOTS + code). In Strict each
such op's executable does this; a DeferAndFuse graph takes the chain once and passes it
through its checked nodes in order. So nothing waits and no extra program runs: the
codes are combined inside the programs that run anyway, and the chain's value after a
program is ready exactly when that program has finished.

A synchronization (`check`: every host read through _transfer.to_cpu, so item(), .cpu(),
.tolist() and printing; torch.tpu.synchronize()) copies the latest *ready* value of the
chain to the host, one transfer, and raises `DeviceAssertError` for the op it names. What
it read is dropped, so the process goes on after the error; the op's result keeps XLA's
clamped values, as CUDA's keeps whatever its kernel wrote.

Why the latest ready value and not the latest: `loss.item()` reads the forward graph, and
waiting for the backward graph flushed just before it would stall the host for the whole
step; combining codes on the device at the sync would be one more program, which the
device runs after everything queued before it, so it would wait too. A device runs its
programs in issue order, so every op issued before the value read has finished by then
(CUDA's stream order) and is covered; a later one is reported at a later sync.
torch.tpu.synchronize() waits for all.

A chain holds _GROUP positions; a longer run without a sync starts a new one (a
*segment*), and with _MAX_PENDING segments unread the finished ones are read at an op
(an error then surfaces there, as CUDA's asynchronous errors do). Checked programs are
linked under one lock, so threads share the chain safely.

`TORCH_TPU_DEVICE_ASSERTS=0` turns the check off (read at import; `forced` overrides it
for a block, so bench modes measures both ways in one process): the programs are then the
same ones run with a constant chain, whose code XLA removes as dead.
"""
from __future__ import annotations

import contextlib
import linecache
import threading

import jax
import jax.numpy as jnp
import torch

from .. import _config, _frames, _runtime, metrics

_SLOTS = 64          # codes per position: an op declares fewer bounds than this
_user_line = _frames.user_line


class DeviceAssertError(torch.AcceleratorError):
    """An op read an index out of range on the device (CUDA: "device-side assert
    triggered"); raised at the synchronization after it. A RuntimeError."""


_SETTING = _config.get("TORCH_TPU_DEVICE_ASSERTS")
_forced = [None]  # `forced`'s value, over the setting's


def enabled() -> bool:
    f = _forced[0]
    return _SETTING if f is None else f


@contextlib.contextmanager
def forced(on: bool | None):
    """Asserts on or off for the block, whatever the setting says (bench modes measures
    both in one process); None leaves the setting in charge."""
    old, _forced[0] = _forced[0], on
    try:
        yield
    finally:
        _forced[0] = old


# ---------------------------------------------------------------- inside the program
def _in_range(b):
    idx = b.index
    if idx is None or not jnp.issubdtype(idx.dtype, jnp.integer):
        return True  # a bool mask selects, it does not address; torch rejects floats
    idx = idx.astype(jnp.int64)  # comparisons with Python ints that fit no smaller dtype
    ok = (idx >= (-b.size if b.negative_ok else 0)) & (idx < b.size)
    if b.ignore is not None:
        ok = ok | (idx == b.ignore)
    return jnp.all(ok)


def op_code(bounds):
    """An op's code from its traced bounds: 0, or 1 + the first bound out of range."""
    code = jnp.zeros((), jnp.int32)
    for k in reversed(range(len(bounds))):
        code = jnp.where(_in_range(bounds[k]), code, jnp.int32(k + 1))
    return code


# ---------------------------------------------------------------- per entry
class Checks:
    """What a checked entry's code means (each bound's noun and description, in code order)
    and, made on first use with asserts off, its Strict program without the chain."""

    __slots__ = ("nouns", "plain", "texts")

    def __init__(self, bounds):
        self.nouns = tuple(b.noun for b in bounds)
        self.texts = tuple(b.describe() for b in bounds)
        self.plain = None


def declare(spec, vals):
    """An OpPlan compiling a new entry: its Checks (None without index arguments). `vals`
    are the call's arguments; the bounds depend only on their shapes, which the entry's
    key fixes."""
    if spec is None:
        return None
    bounds = spec(vals)
    if not bounds:
        return None
    if len(bounds) >= _SLOTS:
        raise RuntimeError(f"torch_tpu: {len(bounds)} index bounds in one op, at most {_SLOTS - 1}")
    return Checks(bounds)


def fold(chain, code):
    """The chain's value (traced, int64) after one more op, whose code is `code` (0, or 1
    + its failing bound): one more op counted; the first nonzero code kept, tagged."""
    pos = chain >> 32
    first = chain & 0xFFFFFFFF
    tagged = jnp.where(code != 0, pos * _SLOTS + code.astype(jnp.int64), 0)
    return ((pos + 1) << 32) | jnp.where(first != 0, first, tagged)


def decode(value):
    """A chain's value read on the host -> (position, bound index) of its first nonzero
    code, or None."""
    first = int(value) & 0xFFFFFFFF
    return divmod(first, _SLOTS) if first else None


# the abstract chain value, for tracing a checked program for its shapes
LINK_SHAPES = (jax.ShapeDtypeStruct((), jnp.int64),)


def unlinked():
    """A chain value for a checked program run outside the chain (asserts off): its code
    is then dead, and XLA removes it."""
    return (jnp.int64(0),)


def run_strict(entry, bufs, dyns, frame=None):
    """Strict's call of a checked entry: its results; the chain takes its code. `frame`:
    the user's (file, line) of the call, when it ran later (Strict's compile window)."""
    if not enabled():
        checks = entry.checks
        if checks.plain is None:
            raw = entry.raw
            checks.plain = jax.jit(lambda *flat: raw(*flat, *unlinked())[:-1])
        return checks.plain(*bufs, *dyns)
    return _run_linked(entry.fn, (*bufs, *dyns), ((entry, frame or _user_line()),))


def checked_nodes(nodes):
    """Positions of a pending graph's checked nodes: those whose codes its program folds."""
    return tuple(i for i, n in enumerate(nodes) if n.entry.checks is not None)


def run_graph(fn, args, nodes, checked):
    """DeferAndFuse's call of a flushed graph with checked nodes (fuse._build: like a
    checked op's, its last argument is the chain's value, its last result the chain's new
    value)."""
    return _run_linked(fn, args, [(nodes[i].entry, nodes[i].frame) for i in checked])


# ---------------------------------------------------------------- the chain
class _Segment:
    """`sources[p]`: the (entry, user line) of position p; `values`: the chain's value after
    each program linked into it, in issue order, those not yet read."""

    __slots__ = ("sources", "values", "device")

    def __init__(self, device):
        self.sources = []
        self.values = []
        self.device = device  # (a chain stays on one device: several per process)


_pending: list = []   # segments with unread values, oldest first; the last one is extended
_lock = threading.Lock()
_GROUP = 256          # positions per segment (then a new chain: bounds what is held)
_MAX_PENDING = 8      # unread segments before the finished ones are read at an op
_ZERO: dict = {}      # device -> the int64 zero a new chain starts from (made on first use)


def _run_linked(fn, args, sources):
    """Run a checked program linked into the chain: `fn(*args, chain)` -> its results and,
    last, the chain's new value."""
    n = len(sources)
    device = _runtime.device()
    with _lock:  # linking, the (asynchronous) call and the new value, in one order
        seg = _pending[-1] if _pending else None
        new = seg is None or len(seg.sources) + n > _GROUP or seg.device != device
        if new:
            seg = _Segment(device)
        if seg.values:
            chain = seg.values[-1]
        else:
            chain = _ZERO.get(device)
            if chain is None:  # committed, as every later value is: jit compiles a program
                # again for an argument that is not (a 1-2 s stall on a cache hit)
                chain = _ZERO[device] = jax.device_put(jnp.zeros((), jnp.int64), device)
        outs = fn(*args, chain)
        if new:  # (only once its first program was accepted)
            _pending.append(seg)
        seg.sources.extend(sources)
        seg.values.append(outs.pop())
        crowded = len(_pending) >= _MAX_PENDING
    metrics.counters["device_asserts.issued"] += n
    if crowded:  # nobody syncs
        check()
        if len(_pending) >= _MAX_PENDING:
            check(wait=True)
    return outs


def check(wait: bool = False) -> None:
    """A synchronization: read each segment's latest value that is ready (the latest of all
    with `wait`), one transfer for all, and raise for the first op that read an index out
    of range."""
    if not _pending:
        return
    with _lock:
        picked = []
        for seg in _pending:
            for i in range(len(seg.values) - 1, -1, -1):
                if wait or seg.values[i].is_ready():
                    picked.append((seg, i))
                    break
        if not picked:
            return
        metrics.counters["device_asserts.reads"] += 1
        metrics.counters["device_asserts.values_read"] += len(picked)
        values = jax.device_get([seg.values[i] for seg, i in picked])
        error = None
        for (seg, i), v in zip(picked, values):
            bad = decode(v)
            if bad is not None and error is None:
                error = (bad, seg.sources)
            if bad is not None or i == len(seg.values) - 1:
                # all read (the next op starts a new chain from 0), or holding the error:
                # dropped whole, so the state resets
                _pending.remove(seg)
            else:
                del seg.values[:i + 1]
    if error is not None:
        raise _error(*error)


def _error(bad, sources):
    entry, frame = sources[bad[0]]
    k = bad[1] - 1
    checks = entry.checks
    metrics.counters["device_asserts.raised"] += 1
    source = linecache.getline(frame[0], frame[1]).strip()
    return DeviceAssertError(
        f"torch_tpu: device-side assert triggered: {checks.nouns[k]} out of bounds in "
        f"{entry.key[0]} issued at {_frames.location(*frame)} ({checks.texts[k]})"
        + (f"\n    {source}" if source else "")
        + "\nReported at the first synchronization after the op ran; its result holds "
        "clamped or NaN values. Debug mode (TORCH_TPU_LAUNCH_BLOCKING=1) raises at the call "
        "and names the value; TORCH_TPU_DEVICE_ASSERTS=0 turns this check off.")
