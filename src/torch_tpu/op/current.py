"""Which executor runs this thread's ops: the service the layers below the executors ask.

The storage, transfer, device and op-plan layers need "the current executor" (to flush
before a host read, to record an upload, to make a fresh storage's zeros) but must not
import the executors themselves, which import them. This module holds the state, and
only it: the process-wide (mode, executor), the per-thread stack of `eager_mode` blocks
and the blocks open on every thread. `eager/modes.py` builds the executors and changes
the state through `set_global`, `enter` and `leave`; everything else reads it here.

The op kernels (csrc/kernel.cpp) read the current executor on every op, where calling
`executor()` would cost a Python call, so C keeps a cache of it: this thread's innermost
block's executor (thread-local) and the global one while no block is open on any thread.
`_publish`, called by every change here, is the only writer of that cache, and of C's
lazy-allocation flag: storages made while any executor that defers (DeferAndFuse) is the
global one or a block's start without a buffer; eager/modes.py says which defer (`lazy`).

Every executor answers the same interface (`execute`, `flush`, `constant`, `fill`,
`upload`, `backward`), so no caller tests which mode it is in.
"""
from __future__ import annotations

import threading

from .. import _C


class _State(threading.local):
    def __init__(self):
        self.stack = []          # (mode, executor, lazy) of each block open on this thread
        self.executor = None     # the innermost block's executor, None = the global one
        # Threads that Python did not start (the autograd engine's device thread runs
        # every backward op of a tpu graph) cannot enter a block themselves: they follow
        # the innermost block open on the thread that is waiting for them.
        self.foreign = isinstance(threading.current_thread(), threading._DummyThread)


_tls = _State()
# the process-wide mode and its executor; eager/modes.py installs Strict at import
_GLOBAL: dict = {"mode": None, "executor": None, "lazy": False}
_OPEN: list = []  # (mode, executor, lazy) of every open `eager_mode` block, all threads


def executor():
    """The executor that runs the calling thread's ops."""
    ex = _tls.executor
    if ex is None:
        if _tls.foreign and _OPEN:
            return _OPEN[-1][1]
        return _GLOBAL["executor"]
    return ex


def mode():
    """The calling thread's eager mode (innermost `eager_mode` block, else the global)."""
    if _tls.stack:
        return _tls.stack[-1][0]
    if _tls.foreign and _OPEN:
        return _OPEN[-1][0]
    return _GLOBAL["mode"]


def set_global(mode, ex, lazy: bool) -> None:
    """The process-wide mode and its executor (a thread inside a block keeps its own);
    `lazy`: whether it defers, so that storages made under it start without a buffer."""
    _GLOBAL.update(mode=mode, executor=ex, lazy=lazy)
    _publish()


def swap_global(old, new, *, outside_blocks=False) -> bool:
    """Make `new` the process-wide executor in place of `old`, the mode unchanged, if
    `old` is the process-wide executor (and, `outside_blocks`, no block is open on any
    thread). Strict's compile window (eager/window.py) opens and closes so. -> whether
    it did."""
    if _GLOBAL["executor"] is not old or (outside_blocks and _OPEN):
        return False
    _GLOBAL["executor"] = new
    _publish()
    return True


def enter(mode, ex, lazy: bool):
    """Open an `eager_mode` block on this thread (`lazy` as for set_global); its token,
    for `leave`."""
    token = (mode, ex, lazy)
    _tls.stack.append(token)
    _tls.executor = ex
    _OPEN.append(token)
    _publish()
    return token


def leave(token) -> None:
    """Close this thread's innermost block (opened by `enter` as `token`)."""
    _OPEN.remove(token)
    _tls.stack.pop()
    _tls.executor = _tls.stack[-1][1] if _tls.stack else None
    _publish()


def _publish() -> None:
    """Write C's cache of this state (see the module doc): this thread's block's executor,
    the global one unless a block is open on some thread (then a thread without a block
    asks `executor()`), and whether the global executor or any block's defers."""
    _C.set_current_executors(_tls.executor, None if _OPEN else _GLOBAL["executor"])
    _C.set_lazy_allocations(_GLOBAL["lazy"] or any(lazy for _, _, lazy in _OPEN))


def flush_pending(reason: str = "sync") -> None:
    """Run whatever the current mode has deferred (nothing in Strict and Debug); `reason`
    is the trigger counted in metrics (item, to_cpu, print, synchronize, ...)."""
    executor().flush(reason)


def backward_pass():
    """A context around a backward() call (see _patches): DeferAndFuse flushes the forward
    graph recorded so far, so the device runs it while the backward records, and its loop
    detection ignores the repetition of layers within the backward pass."""
    return executor().backward()
