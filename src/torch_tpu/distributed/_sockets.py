"""The send buffers of the sockets under XLA:CPU's cross-process collectives.

On XLA:CPU, a collective between processes runs over gloo's TCP transport inside jaxlib:
the first collective over a set of devices connects gloo's socket pairs. gloo sizes a
pair's send buffer itself, once, from a message it sends (strace: one
`setsockopt(SO_SNDBUF, 9073)` per process, from the object scatter below; small
all-reduces and barriers before it set nothing), and never again. When that message is
small, as in the object broadcast, gather and scatter of a DCP checkpoint load (torchtitan
loads one before its first step), the buffer stays at 9-18 KB for the life of the
process, against the ~4 MB the kernel gives a socket nobody sized. A
64 KB loopback segment then waits for the peer's delayed ACK (rtt 4-40 ms instead of
0.01 ms) before the next is queued. Measured, 2 processes on one host (Linux 6.18):

| 2 processes | all_gather, 852 KB bf16 per rank | torchtitan 0.2.2 FSDP=2, seq 256 |
| --- | ---: | ---: |
| object collectives first, gloo's buffer size | 1,019 ms | 23-25 s a step |
| the same, the buffer set here | 11 ms | 1.1-1.2 s a step |

jaxlib offers no socket options, so each process sets SO_SNDBUF on the sockets that the
first collective over each group opened (known by difference: the sockets before its
dispatch against those after it completed), and sets it again whenever gloo has lowered
it: the watchdog thread looks after the collectives it sees complete (a getsockopt per
socket; the host never waits). A socket that happens to open beside that first collective
gets the larger buffer too, which does it no harm. TORCH_TPU_DIST_SOCKET_SNDBUF sets the
size; 0 leaves gloo's. On a TPU or GPU collectives do not use these sockets, and nothing
here runs.
"""
from __future__ import annotations

import functools
import os
import socket

from .. import _config, _runtime, metrics

_SNDBUF = _config.get("TORCH_TPU_DIST_SOCKET_SNDBUF")
_FD_DIR = "/proc/self/fd"
_seen: set = set()  # the groups (ordered ranks) whose first collective has been issued
_tracked: dict = {}  # inode -> fd: the sockets those first collectives opened


@functools.lru_cache(maxsize=None)
def _target() -> int:
    """The send buffer SO_SNDBUF=_SNDBUF gives: Linux caps the request at wmem_max and
    doubles it (bookkeeping overhead). A socket whose buffer the kernel grew past that
    (where wmem_max is low) is left as it is."""
    try:
        with open("/proc/sys/net/core/wmem_max") as f:
            cap = int(f.read())
    except (OSError, ValueError):
        cap = _SNDBUF
    return 2 * min(_SNDBUF, cap)


def first_collective(ranks) -> dict | None:
    """Call before dispatching a collective over `ranks`. The first time for these ranks
    on XLA:CPU: this process's sockets now (inode -> fd), for `adopt` once it completed.
    Otherwise None."""
    if not _SNDBUF or ranks in _seen:
        return None
    _seen.add(ranks)
    if _runtime.device().platform != "cpu":
        return None
    return sockets()


def sockets() -> dict:
    """This process's open sockets: {inode: fd}; empty where /proc is not there."""
    out = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out[target[8:-1]] = int(name)
    return out


def adopt(before: dict) -> None:
    """Track the sockets opened since `before` (this process's sockets before a group's
    first collective, which has now completed), and set their send buffers."""
    for inode, fd in sockets().items():
        if inode not in before:
            _tracked[inode] = fd
    keep()


def keep() -> int:
    """Set the send buffer of each tracked socket that is below the target (again, where
    gloo lowered it); drop those that closed or are not connected TCP sockets. Returns
    how many were set (also counted as `dist.socket_buffers_set`)."""
    if not _tracked:
        return 0
    target, done = _target(), 0
    for inode, fd in list(_tracked.items()):
        verdict = _fix(fd, inode, target)
        if verdict is None:
            del _tracked[inode]
        elif verdict:
            done += 1
    if done:
        metrics.count("dist.socket_buffers_set", done)
    return done


def _fix(fd: int, inode: str, target: int) -> bool | None:
    """Set SO_SNDBUF on `fd` if it still is socket `inode`, a connected TCP socket whose
    send buffer is below `target`: True if set, False if it needed nothing, None if it is
    not (or no longer) such a socket."""
    try:
        if os.readlink(f"{_FD_DIR}/{fd}") != f"socket:[{inode}]":
            return None  # closed (its number may be another file's now)
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        s = socket.socket(fileno=dup)  # the same socket as `fd`; closing it closes `dup`
    except OSError:
        os.close(dup)
        return None
    with s:
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            s.getpeername()  # connected (a listening socket raises)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= target:
                return False
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
            return True
        except OSError:
            return None
