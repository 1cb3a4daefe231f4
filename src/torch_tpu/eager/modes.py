"""The eager mode API: which executor runs the ops of this thread.

Names follow the reference system (TorchTPU): DEFER_NEVER is Strict (default),
DEFER_NEVER_AND_LAUNCH_BLOCKING is Debug, DEFER_AND_FUSE is the fusing mode. A global mode
is set with `set_eager_mode` (or the environment), and `with eager_mode(m):` overrides it
for the current thread, the innermost block winning. Every switch first runs whatever the
mode being left has deferred.
"""
from __future__ import annotations

import contextlib
import enum
import os
import threading

from .. import _C, metrics
from .strict import StrictExecutor


class EagerMode(enum.Enum):
    STRICT = "strict"
    DEBUG = "debug"
    DEFER_AND_FUSE = "defer_and_fuse"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"


def _make_executors():
    from .debug import DebugExecutor
    from .defer import DeferExecutor

    defer = DeferExecutor()
    _C.kernel_setup(executor, defer, metrics.counters, "dispatches.defer_and_fuse")
    return {EagerMode.STRICT: StrictExecutor(), EagerMode.DEBUG: DebugExecutor(),
            EagerMode.DEFER_AND_FUSE: defer}


_EXECUTORS = {EagerMode.STRICT: StrictExecutor()}


def _env_mode() -> EagerMode:
    if os.environ.get("TORCH_TPU_LAUNCH_BLOCKING", "0") not in ("", "0"):
        return EagerMode.DEBUG
    if os.environ.get("TORCH_TPU_DEFER_AND_FUSE", "0") not in ("", "0"):
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.STRICT


class _State(threading.local):
    def __init__(self):
        self.stack = []          # modes entered with `eager_mode(...)` on this thread
        self.executor = None     # this thread's current executor, None = the global one
        # Threads that Python did not start (the autograd engine's device thread runs
        # every backward op of a tpu graph) cannot enter a context themselves: they follow
        # the innermost context open on the thread that is waiting for them.
        self.foreign = isinstance(threading.current_thread(), threading._DummyThread)


_tls = _State()
_global = {"mode": EagerMode.STRICT, "executor": _EXECUTORS[EagerMode.STRICT]}
_open_contexts: list = []  # (mode, executor) of every open `eager_mode` block, all threads


def executor():
    ex = _tls.executor
    if ex is None:
        if _tls.foreign and _open_contexts:
            return _open_contexts[-1][1]
        return _global["executor"]
    return ex


_C.kernel_setup(executor, None, metrics.counters, "dispatches.defer_and_fuse")
_C.set_executor(_global["executor"])


def _executor_for(mode: EagerMode):
    if mode not in _EXECUTORS:
        _EXECUTORS.update({m: e for m, e in _make_executors().items() if m not in _EXECUTORS})
    return _EXECUTORS[mode]


def _coerce(mode) -> EagerMode:
    if isinstance(mode, EagerMode):
        return mode
    if isinstance(mode, str):
        try:
            return EagerMode[mode.upper()]
        except KeyError:
            return EagerMode(mode.lower())
    raise TypeError(f"expected a torch_tpu.EagerMode, got {mode!r}")


def flush_pending(reason: str = "sync") -> None:
    """Run whatever the current mode has deferred (nothing in Strict and Debug); `reason`
    is the trigger counted in metrics (item, to_cpu, print, synchronize, ...)."""
    ex = executor()
    if ex.deferred:
        ex.flush(reason)


@contextlib.contextmanager
def backward_pass():
    """Around a backward() call (see _device): DeferAndFuse flushes the forward graph
    recorded so far, so the device runs it while the backward records, and its loop
    detection ignores the repetition of layers within the backward pass."""
    ex = executor()
    if not ex.deferred:
        yield
        return
    ex.flush("backward")
    ex.in_backward += 1
    try:
        yield
    finally:
        ex.in_backward -= 1


def _switch_flush() -> None:
    for ex in _EXECUTORS.values():
        if ex.deferred:
            ex.flush("mode_change")


def _publish() -> None:
    """Tell the C side what changed: storages made while any DeferAndFuse executor is
    active start without a buffer; the op kernels (csrc/kernel.cpp) use the global
    executor directly while no `eager_mode` block is open on any thread (each block also
    tells them its thread's executor)."""
    lazy = _global["executor"].deferred or any(ex.deferred for _, ex in _open_contexts)
    _C.set_lazy_allocations(lazy)
    _C.set_executor(None if _open_contexts else _global["executor"])


def get_eager_mode() -> EagerMode:
    if _tls.stack:
        return _tls.stack[-1]
    if _tls.foreign and _open_contexts:
        return _open_contexts[-1][0]
    return _global["mode"]


def set_eager_mode(mode) -> None:
    """Set the process-wide eager mode (a thread inside `eager_mode(...)` keeps its own)."""
    mode = _coerce(mode)
    _switch_flush()
    _global["mode"] = mode
    _global["executor"] = _executor_for(mode)
    _publish()


@contextlib.contextmanager
def eager_mode(mode):
    """Run the block in `mode` on this thread; the innermost block wins."""
    mode = _coerce(mode)
    _switch_flush()
    _tls.stack.append(mode)
    _tls.executor = _executor_for(mode)
    _C.set_thread_executor(_tls.executor)
    token = (mode, _tls.executor)
    _open_contexts.append(token)
    _publish()
    try:
        yield
    finally:
        _switch_flush()
        _open_contexts.remove(token)
        _publish()
        _tls.stack.pop()
        _tls.executor = _executor_for(_tls.stack[-1]) if _tls.stack else None
        _C.set_thread_executor(_tls.executor)


def init_from_env() -> None:
    mode = _env_mode()
    if mode is not EagerMode.STRICT:
        set_eager_mode(mode)
