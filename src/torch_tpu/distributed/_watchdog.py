"""The watchdog: every collective in flight is checked until it completes, and no value
a failed or refused collective fed reaches user code.

Collectives are asynchronous (their results are XLA futures, as a NCCL stream's are), so
a failure or a hang would otherwise surface only when someone reads a value, or never.
A daemon thread looks at the oldest unfinished collective of each group:
  - it finished with an error (a peer died: gloo sees the closed connection at once) ->
    the links (`_liveness.py`) name the dead rank within milliseconds: one message
    naming it, then the process exits;
  - it was refused (the members issued different collectives) -> the mismatch, rank by
    rank; it has run longer than the group's timeout -> the same, as NCCL's watchdog.
Exiting, rather than raising later at some unrelated `.item()`, is what NCCL's async error
handling does and what keeps a job from hanging (`_bootstrap.fail`: the policy, and
TORCH_TPU_DIST_ASYNC_ERROR_HANDLING=0 to raise instead).

A refused collective's outputs are zeros, and a failed one's are XLA errors. Every read
of a device value (`_runtime.guard_reads`: .item(), .cpu(), printing, torch.save,
synchronize) therefore checks, once the value arrived, the newest finished collective of
each group (one 4-byte read, once per collective): its token is negative after a refusal
anywhere earlier in the chain, so a read never hands out a refused collective's zeros,
even before this thread had a look. A raw XLA error at a read becomes the collective's
own error.
"""
from __future__ import annotations

import atexit
import collections
import re
import threading
import time

import numpy as np
from jax.errors import JaxRuntimeError

from .. import _config, _runtime
from . import _bootstrap, _liveness, _sockets
from .collectives import CollectiveMismatch, explain, local, mismatch_message

_POLL_S = _config.get("TORCH_TPU_DIST_WATCHDOG_POLL_S")
# How long a collective that failed on a closed connection waits for the links to name
# the peer that died (they report within milliseconds; this bounds a lost notice).
_NAME_WAIT_S = 2.0


class _Entry:
    __slots__ = ("gm", "name", "ok", "on_done", "ranks", "rows", "seq", "t0", "timeout",
                 "token", "what")

    def __init__(self, gm, what, timeout):
        self.gm = gm
        self.seq = 0  # its number among this rank's collectives on the group
        self.token = self.rows = None  # set once the dispatch returned
        self.ok = False  # its token was read: it ran
        self.on_done = None  # called on this thread once the program finished
        self.name, self.ranks = gm.name, gm.ranks
        self.t0, self.what, self.timeout = time.monotonic(), what, timeout

    def issued(self) -> None:
        rows = self.gm.rows
        self.token, self.rows = local(self.gm.token), None if rows is None else local(rows)


# group mesh id -> its in-flight programs, oldest first (a group's programs finish in order)
_chains: dict = {}
_issued: dict = {}  # group name -> how many collectives this rank issued on it
_lock = threading.Lock()
_thread = [None]


def begin(gm, what, timeout: float) -> _Entry:
    """Watch the program about to be issued on `gm` until its token is ready; call
    `.issued()` on the result once dispatched. Watching starts before the dispatch because
    XLA:CPU runs a program whose inputs are ready inline: a collective whose peer never
    comes blocks inside the dispatch. `what` is a zero-argument callable giving the
    description (built only when reporting)."""
    entry = _Entry(gm, what, timeout)
    with _lock:
        entry.seq = _issued[gm.name] = _issued.get(gm.name, 0) + 1
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
        now, completed = time.monotonic(), False
        for chain in chains:
            done = []
            while chain and chain[0].token is not None and chain[0].token.is_ready():
                done.append(chain.popleft())
            for entry in done:
                if entry.on_done is not None:
                    _call(entry.on_done)
            completed = completed or bool(done)
            if done and not done[-1].ok and _verdict(done[-1]) is not None:
                # a failure or refusal poisons every later token of its group, so the
                # first bad one among these is where it started
                entry, verdict = _first_failure(done)
                if entry is not None:
                    _report(entry, verdict)
            if chain and now - chain[0].t0 > chain[0].timeout:
                entry = chain[0]
                _report(entry, f"did not complete within the timeout of {entry.timeout:.0f} s "
                               f"(init_process_group(timeout=...)): {_laggards(entry)}")
                chain.popleft()
        if completed:
            _call(_sockets.keep)  # gloo may have lowered a send buffer (_sockets.py)


def _call(fn) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (an aside must not stop the watchdog)
        print(f"torch_tpu: tpu_dist watchdog: {fn!r} failed: {e}", flush=True)


def _laggards(entry) -> str:
    """Which members of a timed-out collective's group never issued it, asked over the
    links: the ranks behind, the ranks that did not answer, the ranks already gone."""
    me = _bootstrap.rank()
    counts = _liveness.ask(entry.name, _bootstrap.world(), _NAME_WAIT_S) or {}
    behind = [f"rank {r} has issued only {counts[r] or 0}" for r in entry.ranks
              if r != me and r in counts and (counts[r] or 0) < entry.seq]
    finished = [r for r in _liveness.finished_peers() if r in entry.ranks]
    silent = [r for r in entry.ranks if r != me and r not in counts and r not in finished
              and r not in _liveness.left]
    parts = []
    if behind:
        parts.append(f"{'; '.join(behind)} collective(s) on this group (this one is "
                     f"#{entry.seq} here): it is hung or stopped outside a collective, still "
                     "busy, or took another path")
    if silent:
        parts.append(f"rank(s) {_join(silent)} did not answer (hung with Python blocked, "
                     "or unreachable)")
    parts.append(_finished_note(entry.ranks))
    parts = [p for p in parts if p]
    if not parts:
        return "a rank is hung, stopped, or never issued the matching collective"
    return "; ".join(parts)


def _join(ranks) -> str:
    return ", ".join(map(str, ranks))


def _finished_note(ranks) -> str:
    gone = [r for r in _liveness.finished_peers() if r in ranks]
    if not gone:
        return ""
    return (f"rank(s) {_join(gone)} already finished their script and cannot take part "
            "in it")


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
    return f"tpu_dist: {what}, issued {time.monotonic() - entry.t0:.1f} s ago, {verdict}."


def _report(entry, verdict: str) -> Exception:
    """Report a failed, refused or timed-out collective (`_bootstrap.fail`: once, then
    the exit by default); -> the error to raise when the process goes on."""
    if verdict.startswith("failed") and _blame_peer(_NAME_WAIT_S):
        return _bootstrap.failure_error()
    if entry.gm.failure is None:
        entry.gm.failure = _describe(entry, verdict)
    mismatch = verdict.startswith("tpu_dist: mismatched")
    return _bootstrap.fail(entry.gm.failure, CollectiveMismatch if mismatch else None)


# The XLA statuses of a failed execution (JAX raises them as JaxRuntimeError, or as
# ValueError when a dispatch meets an input buffer that holds a failed program's error);
# not an out-of-memory or an invalid program, which are this rank's own errors.
_FAILED_STATUS = re.compile(r"^(UNKNOWN|INTERNAL|UNAVAILABLE|ABORTED|CANCELLED|"
                            r"DEADLINE_EXCEEDED|FAILED_PRECONDITION|DATA_LOSS): ")


def is_runtime_error(exc) -> bool:
    """Whether `exc` is XLA reporting a failed execution (of a collective, or of a program
    fed by one), rather than an error of the program itself."""
    if isinstance(exc, JaxRuntimeError):
        return not str(exc).startswith(("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"))
    return isinstance(exc, ValueError) and bool(_FAILED_STATUS.match(str(exc)))


def dispatch_failed(entry, exc) -> Exception:
    """Issuing a collective raised (an input came from a failed collective, a peer is
    gone): the error to raise, after reporting it."""
    return _report(entry, f"failed: {explain(str(exc))}")


def _blame_peer(wait: float) -> bool:
    """A collective failed on a closed connection: if the links know (or learn within
    `wait` s) that a peer died or stopped on an error, report that, naming the rank."""
    if not _liveness.wait_for_news(wait):
        return False
    for rank, (how, detail) in list(_liveness.left.items()):
        if how != "ok":
            _bootstrap.peer_lost(rank, how, detail)
            return True
    return False


def wait(gm, timeout_s: float, what: str) -> None:
    """Block until the group's last program finished; raise a clear error if it (or an
    earlier one on the group) failed, or after `timeout_s`."""
    import torch.distributed as dist

    tok = local(gm.token)
    deadline = time.monotonic() + timeout_s
    delay = 1e-5
    while not tok.is_ready():
        if _bootstrap.failure() is not None:
            raise _bootstrap.failure_error()
        if time.monotonic() > deadline:
            with _lock:
                chain = list(_chains.get(id(gm), ()))
            raise dist.DistBackendError(
                f"tpu_dist: {what} did not complete within {timeout_s:.0f} s: "
                + (_laggards(chain[-1]) if chain else "a rank is hung, stopped, or never "
                   "reached it"))
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    _check_finished()


# ---------------------------------------------------------------- reads
def _check_finished() -> None:
    """Raise (or exit) if the newest finished collective of some group failed or was
    refused: a value read now may come from it."""
    if _bootstrap.failure() is not None:
        raise _bootstrap.failure_error()
    with _lock:
        chains = [list(c) for c in _chains.values() if c]
    for entries in chains:
        for i in range(len(entries) - 1, -1, -1):
            entry = entries[i]
            if entry.token is None or not entry.token.is_ready():
                continue
            if entry.ok:
                break
            if _verdict(entry) is None:
                entry.ok = True
                break
            first, verdict = _first_failure(entries[:i + 1])
            if first is None:  # refused only for an earlier failure, already popped
                first, verdict = entry, ("was skipped because an earlier collective on "
                                         "its group failed")
            raise _report(first, verdict)


def _guard_read(error) -> None:
    """`_runtime.guard_reads`: after every read of device values."""
    if not _bootstrap.is_initialized() or _bootstrap.world() <= 1:
        return
    if error is None:
        _check_finished()
        return
    better = _explain_crash(error)
    if better is not None:
        raise better from None


def _in_flight() -> str:
    """What this rank was doing: the oldest collective not known to have run."""
    with _lock:
        entries = [e for c in _chains.values() for e in list(c) if not e.ok]
    if not entries:
        return ""
    e = min(entries, key=lambda e: e.t0)
    try:
        what = e.what()
    except Exception:  # noqa: BLE001
        what = "a collective"
    return f"This rank was in {what}, issued {time.monotonic() - e.t0:.1f} s ago."


def _explain_crash(exc) -> Exception | None:
    """A raw XLA error from a collective (at a read, or an uncaught one at an op that
    consumed a collective's result) -> the collective's own error: the first failed
    collective still pending, or the peer the links blame, or the error in words. Any
    other exception is left as it is."""
    if not is_runtime_error(exc):
        return None
    if _bootstrap.failure() is not None:
        return _bootstrap.failure_error()
    with _lock:
        chains = [[e for e in c if e.token is not None and e.token.is_ready()]
                  for c in _chains.values()]
    for chain in chains:
        entry, verdict = _first_failure(chain)
        if entry is not None:
            return _report(entry, verdict)
    text = str(exc)
    if not any(s in text.lower() for s in ("gloo", "nccl", "collective")):
        return None  # not from a collective (an op's own error): left as it is
    if _blame_peer(_NAME_WAIT_S):
        return _bootstrap.failure_error()
    return _bootstrap.fail(explain(text))


_bootstrap._crash_hooks.append(_explain_crash)
_liveness.on_progress(_issued.get)
_bootstrap._context_hooks.append(_in_flight)
_runtime.guard_reads(_guard_read)
