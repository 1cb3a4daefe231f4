"""The read watchdog: a wait for device values that never ends ends the process, with a
message naming what it waited for and where, instead of hanging without a word.

A read (`.item()`, `.cpu()`, print, synchronize, each op in Debug mode) blocks inside
jaxlib's BlockUntilReady, which no signal and no other thread can interrupt: a buffer
that never becomes ready (a runtime that lost a program: issue 53's hang) leaves the
process asleep for good. So, as NCCL's watchdog does for a collective past its timeout,
a daemon thread looks at the waits in progress every few seconds, and one that has
lasted TORCH_TPU_READ_TIMEOUT_S prints what it waited for (the op in Debug mode, else
the read and the tensor), the user's line it waits at, every thread's stack, and ends
the process (exit 1). It cannot raise: the waiting thread never returns to Python.

Cost: a wait is one dict store and one pop around the blocking call (~0.3 us); nothing
is polled. Waiting in a thread that could give up instead would cost a hand-off on every
read (~20-50 us), a decode loop's per-token read included. Under tpu_dist the timeout
is at least the process group's own plus a minute, so the group's watchdog, which names
the rank at fault, speaks first.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import jax

from . import _config, _frames

_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))  # a prefix of jaxlib's too
_WAITS: dict = {}  # thread id -> (monotonic start, what: a str, or (str, array))
_state = {"timeout": _config.get("TORCH_TPU_READ_TIMEOUT_S"), "thread": None}
if _state["timeout"] <= 0:
    _state["thread"] = False  # off: never started
_lock = threading.Lock()


def begin(what) -> None:
    """This thread starts waiting for `what`: a description, or (a description, the
    array awaited), formatted only if the wait times out."""
    _WAITS[threading.get_ident()] = (time.monotonic(), what)
    if _state["thread"] is None:
        _start()


def end() -> None:
    _WAITS.pop(threading.get_ident(), None)


def at_least(seconds: float) -> None:
    """Waits may last `seconds` (a process group's timeout) before the watchdog acts."""
    if _state["timeout"] > 0:
        _state["timeout"] = max(_state["timeout"], seconds)


def _start() -> None:
    with _lock:
        if _state["thread"] is None and _state["timeout"] > 0:
            t = threading.Thread(target=_watch, name="torch_tpu-read-watchdog", daemon=True)
            t.start()
            _state["thread"] = t


def _watch() -> None:
    while True:
        limit = _state["timeout"]
        time.sleep(min(max(limit / 8, 0.05), 10.0))
        now = time.monotonic()
        for tid, (t0, what) in list(_WAITS.items()):
            if now - t0 >= limit:
                _give_up(tid, now - t0, what)


def _describe(what) -> str:
    if isinstance(what, tuple):
        text, arr = what
        return f"{text} (an XLA array of shape {tuple(arr.shape)}, {arr.dtype})"
    return what


def _waiting_line(tid) -> str:
    """The user's line the thread waits at (past jax's frames too: Debug waits in jax)."""
    frame = _frames.outside(sys._current_frames().get(tid))[0]
    while frame is not None and frame.f_code.co_filename.startswith(_JAX_DIR):
        frame = _frames.outside(frame.f_back)[0]
    return _frames.describe(frame) if frame is not None else "<no user frame>"


def _give_up(tid, waited: float, what) -> None:
    msg = (f"torch_tpu: {_describe(what)} has waited {waited:.0f} s for a device value "
           f"that never became ready (TORCH_TPU_READ_TIMEOUT_S={_state['timeout']:g}).\n"
           f"  waiting at {_waiting_line(tid)}\n"
           "The XLA runtime lost the program that should produce it, or that program "
           "never ends. A wait inside XLA cannot be interrupted, so the process ends here "
           "rather than hang. Rerun with TORCH_TPU_LAUNCH_BLOCKING=1 (Debug mode waits for "
           "each op, so this message names the op), and see every thread's stack below.\n")
    try:
        sys.stderr.write(msg)
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
    finally:
        os._exit(1)
