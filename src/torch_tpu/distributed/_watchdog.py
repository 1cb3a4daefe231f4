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

import atexit
import collections
import threading
import time

from .. import _config
from . import _bootstrap
import numpy as np

from .collectives import explain, local, mismatch_message

_POLL_S = _config.get("TORCH_TPU_DIST_WATCHDOG_POLL_S")
_ABORT = _config.get("TORCH_TPU_DIST_ASYNC_ERROR_HANDLING")


class _Entry:
    __slots__ = ("gm", "token", "rows", "name", "ranks", "t0", "what", "timeout")

    def __init__(self, gm, what, timeout):
        self.gm = gm
        self.token = self.rows = None  # set once the dispatch returned
        self.name, self.ranks = gm.name, gm.ranks
        self.t0, self.what, self.timeout = time.monotonic(), what, timeout

    def issued(self) -> None:
        rows = self.gm.rows
        self.token, self.rows = local(self.gm.token), None if rows is None else local(rows)


# group mesh id -> its in-flight programs, oldest first (a group's programs finish in order)
_chains: dict = {}
_lock = threading.Lock()
_thread = [None]
_reported = [False]


def begin(gm, what, timeout: float) -> _Entry:
    """Watch the program about to be issued on `gm` until its token is ready; call
    `.issued()` on the result once dispatched. Watching starts before the dispatch because
    XLA:CPU runs a program whose inputs are ready inline: a collective whose peer never
    comes blocks inside the dispatch. `what` is a zero-argument callable giving the
    description (built only when reporting)."""
    entry = _Entry(gm, what, timeout)
    with _lock:
        chain = _chains.get(id(gm))
        if chain is None:
            chain = _chains[id(gm)] = collections.deque()
        chain.append(entry)
    if _thread[0] is None:
        _start()
    return entry


def cancel(entry) -> None:
    with _lock:
        try:
            _chains[id(entry.gm)].remove(entry)
        except (KeyError, ValueError):
            pass


_stop = threading.Event()


def _start() -> None:
    with _lock:
        if _thread[0] is not None:
            return
        t = threading.Thread(target=_loop, name="tpu_dist-watchdog", daemon=True)
        _thread[0] = t
    t.start()
    # Stop before the interpreter finalizes: a daemon thread caught inside a JAX call
    # then is ended with a forced unwind through C++ frames, which aborts the process.
    atexit.register(_shutdown)


def _shutdown() -> None:
    _stop.set()
    t = _thread[0]
    if t is not None and t is not threading.current_thread():
        t.join(timeout=2 * _POLL_S + 1.0)


def _verdict(entry) -> str | None:
    """None if the finished program is fine, else what went wrong ("" when it was refused
    only because an earlier call on its group had failed)."""
    try:
        value = int(np.asarray(entry.token)[0])
    except Exception as e:  # noqa: BLE001  (the execution failed)
        return f"failed: {explain(str(e))}"
    if value >= 0:
        return None
    if entry.rows is None:
        return ""
    msg = mismatch_message(entry.name, entry.ranks, np.asarray(entry.rows))
    return msg or ""


def _loop() -> None:
    # Each poll looks at every entry once when it finishes (is_ready, no host transfer)
    # and reads one token per group: the GIL is held for microseconds, not in proportion
    # to the number of collectives in flight.
    while not _stop.wait(_POLL_S):
        with _lock:
            chains = [c for c in _chains.values() if c]
        now = time.monotonic()
        for chain in chains:
            done = []
            while chain and chain[0].token is not None and chain[0].token.is_ready():
                done.append(chain.popleft())
            if done and _verdict(done[-1]) is not None:
                # a failure or refusal poisons every later token of its group, so the
                # first bad one among these is where it started
                entry, verdict = _first_failure(done)
                if entry is not None:
                    _report(entry, verdict)
            if chain and now - chain[0].t0 > chain[0].timeout:
                _report(chain[0], f"did not complete within the timeout of "
                                  f"{chain[0].timeout:.0f} s (init_process_group(timeout=...)): "
                                  "a rank is hung, stopped, or never issued the matching "
                                  "collective")
                chain.popleft()


def _first_failure(chain):
    for entry in chain:
        verdict = _verdict(entry)
        if verdict:
            return entry, verdict
    return None, None


def _describe(entry, verdict: str) -> str:
    try:
        what = entry.what()
    except Exception:  # noqa: BLE001
        what = "a collective"
    if verdict.startswith("tpu_dist: mismatched"):
        return f"{what}: {verdict}"
    return f"{what}, issued {time.monotonic() - entry.t0:.1f} s ago, {verdict}."


def wait(gm, timeout_s: float, what: str) -> None:
    """Block until the group's last program finished; raise a clear error if it (or an
    earlier one on the group) failed, or after `timeout_s`."""
    import torch.distributed as dist

    from .collectives import CollectiveMismatch, translate

    tok = local(gm.token)
    deadline = time.monotonic() + timeout_s
    delay = 1e-5
    while not tok.is_ready():
        if time.monotonic() > deadline:
            raise dist.DistBackendError(
                f"tpu_dist: {what} did not complete within {timeout_s:.0f} s: a rank is "
                "hung, stopped, or never reached it")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    try:
        value = int(np.asarray(tok)[0])
    except Exception as e:  # noqa: BLE001
        raise translate(e) from None
    if value >= 0:
        return
    if gm.failure is None:
        with _lock:
            chain = [e for e in _chains.get(id(gm), ()) if e.token is not None]
        entry, verdict = _first_failure(chain)
        if entry is not None:
            gm.failure = _describe(entry, verdict)
    raise CollectiveMismatch(gm.failure or f"tpu_dist: {what} was skipped because an earlier "
                             f"collective on group {gm.name!r} failed")


def _report(entry, verdict: str) -> None:
    if entry.gm.failure is None:
        entry.gm.failure = _describe(entry, verdict)
    if _reported[0]:
        return
    _reported[0] = True
    msg = entry.gm.failure
    if _ABORT:
        _bootstrap.fail(msg + " Exiting this process so the job does not hang "
                              "(TORCH_TPU_DIST_ASYNC_ERROR_HANDLING=0 to only report).")
    else:
        import sys

        sys.stderr.write(f"\n[tpu_dist rank {_bootstrap.rank()}] {msg}\n")


def _explain_crash(exc) -> None:
    """On an uncaught exception: report the first failed collective still pending (the
    likely cause), or explain a raw collective error."""
    with _lock:
        chains = [[e for e in c if e.token is not None and e.token.is_ready()]
                  for c in _chains.values()]
    for chain in chains:
        entry, verdict = _first_failure(chain)
        if entry is not None:
            if entry.gm.failure is None:
                entry.gm.failure = _describe(entry, verdict)
            if not _reported[0]:
                _reported[0] = True
                import sys

                sys.stderr.write(f"\n[tpu_dist rank {_bootstrap.rank()}] {entry.gm.failure}\n")
            return
    text = str(exc)
    if "Gloo" in text or "collective" in text.lower():
        import sys

        sys.stderr.write(f"\n[tpu_dist rank {_bootstrap.rank()}] {explain(text)}\n")


_bootstrap._crash_hooks.append(_explain_crash)
