"""The eager mode API: which executor runs the ops of this thread.

Names follow the reference system (TorchTPU): DEFER_NEVER is Strict (default),
DEFER_NEVER_AND_LAUNCH_BLOCKING is Debug, DEFER_AND_FUSE is the fusing mode. A global mode
is set with `set_eager_mode` (or the environment), and `with eager_mode(m):` overrides it
for the current thread, the innermost block winning. Every switch first runs whatever the
mode being left has deferred. The state itself (which executor runs this thread's ops, and
C's cache of it) is op/current.py's; this module builds the executors and asks it to switch.
"""
from __future__ import annotations

import contextlib
import enum

from .. import _C, _config, metrics
from ..op import current
from .debug import DebugExecutor
from .defer import DeferExecutor
from ..op.opcall import C_FAST_PATH
from .strict import StrictExecutor
from .window import CompileWindow


class EagerMode(enum.Enum):
    STRICT = "strict"
    DEBUG = "debug"
    DEFER_AND_FUSE = "defer_and_fuse"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"


_STRICT = StrictExecutor()
_STRICT.window = CompileWindow(_STRICT)
_EXECUTORS = {EagerMode.STRICT: _STRICT}


def _setup_kernels(defer=None) -> None:
    """The op kernels run Strict's cached ops and record DeferAndFuse's in C (csrc/kernel.cpp),
    unless TORCH_TPU_C_FAST_PATH=0 sends every op to the executor's Python execute (the
    reference)."""
    fast = C_FAST_PATH
    _C.kernel_setup(current.executor, defer if fast else None, _STRICT if fast else None,
                    metrics.counters, "dispatches.defer_and_fuse", StrictExecutor.counter)


def _make_executors():
    defer = DeferExecutor()
    _setup_kernels(defer)
    return {EagerMode.DEBUG: DebugExecutor(), EagerMode.DEFER_AND_FUSE: defer}


def _env_mode() -> EagerMode:
    if _config.get("TORCH_TPU_LAUNCH_BLOCKING"):
        return EagerMode.DEBUG
    if _config.get("TORCH_TPU_DEFER_AND_FUSE"):
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.STRICT


_setup_kernels()
current.set_global(EagerMode.STRICT, _STRICT, _STRICT.deferred)


def _executor_for(mode: EagerMode):
    if mode not in _EXECUTORS:
        _EXECUTORS.update(_make_executors())
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


def _switch_flush() -> None:
    for ex in _EXECUTORS.values():
        ex.flush("mode_change")


def get_eager_mode() -> EagerMode:
    return current.mode()


def set_eager_mode(mode) -> None:
    """Set the process-wide eager mode (a thread inside `eager_mode(...)` keeps its own)."""
    mode = _coerce(mode)
    _switch_flush()
    ex = _executor_for(mode)
    current.set_global(mode, ex, ex.deferred)


@contextlib.contextmanager
def eager_mode(mode):
    """Run the block in `mode` on this thread; the innermost block wins."""
    mode = _coerce(mode)
    _switch_flush()
    ex = _executor_for(mode)
    token = current.enter(mode, ex, ex.deferred)
    try:
        yield
    finally:
        _switch_flush()
        current.leave(token)


def init_from_env() -> None:
    mode = _env_mode()
    if mode is not EagerMode.STRICT:
        set_eager_mode(mode)
