"""The watchdog: every collective in flight is checked until it completes.

Collectives are asynchronous (their results are XLA futures, as a NCCL stream's are), so
a failure or a hang would otherwise surface only when someone reads a value, or never.
A daemon thread looks at the oldest unfinished collective of each group:
  - it finished with an error (a peer died: gloo sees the closed connection at once) ->
    a clear message, then the process exits;
  - it has run longer than the group's timeout (`init_process_group(timeout=...)`) ->
    the same.
Exiting, rather than raising later at some unrelated `.item()`, is what NCCL's async error
handling does and what keeps a job from hanging: the surviving ranks all stop within
seconds, with the first error printed. `TORCH_TPU_DIST_ASYNC_ERROR_HANDLING=0` only
prints the message and lets the error surface at the next read.
"""
from __future__ import annotations

import collections
import os
import threading
import time

from . import _bootstrap
from .collectives import explain

_POLL_S = float(os.environ.get("TORCH_TPU_DIST_WATCHDOG_POLL_S", "0.05"))
_ABORT = os.environ.get("TORCH_TPU_DIST_ASYNC_ERROR_HANDLING", "1") not in ("0", "")


class _Entry:
    __slots__ = ("token", "t0", "what", "timeout")

    def __init__(self, token, what, timeout):
        self.token, self.t0, self.what, self.timeout = token, time.monotonic(), what, timeout


_pending: collections.deque = collections.deque()
_lock = threading.Lock()
_thread = [None]
_reported = [False]


def track(token, what, timeout: float) -> None:
    """Watch a collective until its output token is ready. `what` is a zero-argument
    callable giving the description (built only when reporting)."""
    entry = _Entry(token, what, timeout)
    with _lock:
        # drop finished ones from the front: cheap, keeps the queue short
        while _pending and _pending[0].token.is_ready() and _ok(_pending[0]):
            _pending.popleft()
        _pending.append(entry)
    if _thread[0] is None:
        _start()


def _ok(entry) -> bool:
    try:
        entry.token.block_until_ready()
        return True
    except Exception:  # noqa: BLE001  (reported by the thread)
        return False


def _start() -> None:
    with _lock:
        if _thread[0] is not None:
            return
        t = threading.Thread(target=_loop, name="tpu_dist-watchdog", daemon=True)
        _thread[0] = t
    t.start()


def pending() -> int:
    with _lock:
        return len(_pending)


def _loop() -> None:
    while True:
        time.sleep(_POLL_S)
        with _lock:
            entries = list(_pending)
        done = []
        for entry in entries:
            if entry.token.is_ready():
                try:
                    entry.token.block_until_ready()
                except Exception as e:  # noqa: BLE001
                    _report(entry, f"failed: {explain(str(e))}")
                    done.append(entry)
                    continue
                done.append(entry)
            elif time.monotonic() - entry.t0 > entry.timeout:
                _report(entry, f"did not complete within the timeout of {entry.timeout:.0f} s "
                               "(init_process_group(timeout=...)): a rank is hung, stopped, "
                               "or never issued the matching collective")
                done.append(entry)
        if done:
            with _lock:
                for entry in done:
                    try:
                        _pending.remove(entry)
                    except ValueError:
                        pass


def _report(entry, verdict: str) -> None:
    if _reported[0]:
        return
    _reported[0] = True
    try:
        what = entry.what()
    except Exception:  # noqa: BLE001
        what = "a collective"
    age = time.monotonic() - entry.t0
    msg = f"{what}, issued {age:.1f} s ago, {verdict}."
    if _ABORT:
        _bootstrap.fail(msg + " Exiting this process so the job does not hang "
                              "(TORCH_TPU_DIST_ASYNC_ERROR_HANDLING=0 to only report).")
    else:
        import sys

        sys.stderr.write(f"\n[tpu_dist rank {_bootstrap.rank()}] {msg}\n")
