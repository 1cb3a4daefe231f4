"""Which executor runs this thread's ops: the service the layers below the executors ask.

The storage, transfer, device and op-plan layers need "the current executor" (to flush
before a host read, to record an upload, to make a fresh storage's zeros) but must not
import the executors themselves, which import them. This module holds only the state:
the process-wide (mode, executor), the per-thread stack of `eager_mode` blocks and the
blocks open on every thread. `eager/modes.py` builds the executors and changes the state;
everything else reads it here.

Every executor answers the same interface (`execute`, `flush`, `constant`, `fill`,
`upload`, `backward`), so no caller tests which mode it is in.
"""
from __future__ import annotations

import threading


class _State(threading.local):
    def __init__(self):
        self.stack = []          # modes entered with `eager_mode(...)` on this thread
        self.executor = None     # this thread's current executor, None = the global one
        # Threads that Python did not start (the autograd engine's device thread runs
        # every backward op of a tpu graph) cannot enter a context themselves: they follow
        # the innermost context open on the thread that is waiting for them.
        self.foreign = isinstance(threading.current_thread(), threading._DummyThread)


tls = _State()
# the process-wide mode and its executor; eager/modes.py installs Strict at import
GLOBAL: dict = {"mode": None, "executor": None}
OPEN_CONTEXTS: list = []  # (mode, executor) of every open `eager_mode` block, all threads


def executor():
    """The executor that runs the calling thread's ops."""
    ex = tls.executor
    if ex is None:
        if tls.foreign and OPEN_CONTEXTS:
            return OPEN_CONTEXTS[-1][1]
        return GLOBAL["executor"]
    return ex


def mode():
    """The calling thread's eager mode (innermost `eager_mode` block, else the global)."""
    if tls.stack:
        return tls.stack[-1]
    if tls.foreign and OPEN_CONTEXTS:
        return OPEN_CONTEXTS[-1][0]
    return GLOBAL["mode"]


def flush_pending(reason: str = "sync") -> None:
    """Run whatever the current mode has deferred (nothing in Strict and Debug); `reason`
    is the trigger counted in metrics (item, to_cpu, print, synchronize, ...)."""
    executor().flush(reason)


def backward_pass():
    """A context around a backward() call (see _patches): DeferAndFuse flushes the forward
    graph recorded so far, so the device runs it while the backward records, and its loop
    detection ignores the repetition of layers within the backward pass."""
    return executor().backward()
