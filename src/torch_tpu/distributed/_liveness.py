"""Which rank died: one link per rank to rank 0, and rank 0's death without JAX's fatal exit.

The links. Every rank keeps one TCP connection to rank 0 (the hub), made when it joins
the job. A process that ends for any reason has its sockets closed by the kernel (a
SIGKILL or the OOM killer included), so the hub sees the end of a link at once and tells
every other rank which rank it was; every rank sees the end of its own link when rank 0
dies. A rank that leaves in an orderly way says how first: "ok" (its script finished) or
"error" (an uncaught exception, a failed collective: with the message). So a link that
ends without a word is a death. TCP keepalive ends a link to a host that vanished
(power, network) within about 10 s. Cost: one idle socket per rank, N on rank 0.
The links also carry one question, asked when a collective timed out: how many
collectives has each rank issued on this group (`ask`)? The ranks behind, or silent, are
the ones a timeout message names.

The coordinator relay. JAX's distributed client (in every process) long-polls rank 0's
coordination service for errors, and ends the process with an absl FATAL ("the JAX
distributed service detected fatal errors") the moment that connection breaks: before
any Python code runs, and without saying which process died. So on the other ranks
JAX's client connects to a relay in this process (127.0.0.1), which forwards the bytes
to rank 0's service. Once the runtime is up, when rank 0's side of the relay closes, the
relay keeps JAX's side open: JAX notices only at its heartbeat timeout (10 s or more),
long after the link to rank 0 has reported rank 0's death and this process has exited.
An orderly exit (this process's or rank 0's "ok") lets the close through, so JAX's
shutdown barrier does not wait on a held connection.

A peer's death or error exit is handed to the handler `_bootstrap` installs (`peer_lost`),
which words the one message and applies the failure policy (exit, or raise at the next
collective or read).
"""
from __future__ import annotations

import json
import selectors
import socket
import threading

KEY = "tpu_dist/links"
_MAX_LINE = 1 << 16

_sel = selectors.DefaultSelector()
_send_lock = threading.Lock()
_news = threading.Condition()
_state = {"rank": None, "thread": None, "hub": None, "closing": False, "armed": False,
          "on_lost": None, "progress": None, "asked": 0}
_answers: dict = {}   # question id -> {rank: count}, for the questions this rank asked
left: dict = {}      # rank -> (how, detail): how the peer left ("ok", "error", "died")
_hub_links: dict = {}  # on rank 0: socket -> the peer's rank (None until its hello)
_held: list = []      # relay sockets on JAX's side, kept open after rank 0's side closed


# ---------------------------------------------------------------- sockets
def _link_socket(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 4), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(2.0)  # a send to a peer that stopped reading gives up (reads wait for data)


def _send(s: socket.socket, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    with _send_lock:
        try:
            s.sendall(data)
        except OSError:
            pass  # the peer is gone: its end of the link reports that


def _loop() -> None:
    while True:
        for key, _ in _sel.select():
            try:
                key.data(key.fileobj)
            except Exception:  # noqa: BLE001  (a link's failure must not end the loop)
                _drop(key.fileobj)


def _ensure_thread() -> None:
    if _state["thread"] is None:
        t = threading.Thread(target=_loop, name="tpu_dist-links", daemon=True)
        _state["thread"] = t
        t.start()


def _drop(s) -> None:
    try:
        _sel.unregister(s)
    except (KeyError, ValueError):
        pass
    try:
        s.close()
    except OSError:
        pass


class _Lines:
    """Newline-framed JSON messages from one socket; `on_end()` when it closes."""

    def __init__(self, on_msg, on_end):
        self.buf, self.on_msg, self.on_end = b"", on_msg, on_end

    def __call__(self, s) -> None:
        data = _receive(s)
        if not data:
            self.on_end(s)
            return
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self.on_msg(s, json.loads(line))
        if len(self.buf) > _MAX_LINE:
            raise ValueError("tpu_dist link: oversized message")


# ---------------------------------------------------------------- what peers report
def _record(rank: int, how: str, detail: str = "") -> None:
    with _news:
        if rank in left:
            return
        left[rank] = (how, detail)
        _news.notify_all()
    if how == "ok" and rank == 0:
        _release_held()
    if how != "ok" and not _state["closing"] and _state["on_lost"] is not None:
        _state["on_lost"](rank, how, detail)


def on_lost(handler) -> None:
    """`handler(rank, how, detail)` runs (on the links' thread) when a peer died or
    stopped on an error."""
    _state["on_lost"] = handler


def wait_for_news(timeout: float) -> bool:
    """Wait up to `timeout` s until some peer's death or error exit is known; whether one
    is. (A collective fails the moment a peer's connection closes; the link that names
    the peer reports within milliseconds of that.)"""
    with _news:
        return _news.wait_for(lambda: any(h != "ok" for h, _ in left.values()), timeout)


def finished_peers() -> list:
    """The ranks known to have finished their script (left in an orderly way)."""
    return sorted(r for r, (h, _) in left.items() if h == "ok")


# ---------------------------------------------------------------- rank 0: the hub
def listen(host: str) -> str:
    """On rank 0, before the others learn the job's addresses: open the hub; -> its address."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(socket.SOMAXCONN)  # every rank connects at once
    _state.update(rank=0, hub=s)
    _sel.register(s, selectors.EVENT_READ, _accept)
    _ensure_thread()
    return f"{host}:{s.getsockname()[1]}"


def _accept(lsock) -> None:
    conn, _ = lsock.accept()
    _link_socket(conn)
    _hub_links[conn] = None
    _sel.register(conn, selectors.EVENT_READ, _Lines(_hub_msg, _hub_end))


def _hub_msg(s, msg) -> None:
    op = msg.get("op")
    if op == "hello":
        _hub_links[s] = int(msg["rank"])
    elif op == "ask":  # a spoke's question: to every other rank, and answered here
        msg["from"] = _hub_links.get(s)
        for other in list(_hub_links):
            if other is not s:
                _send(other, msg)
        _answer(msg, s)
    elif op == "count":  # an answer, for the rank that asked
        if msg["to"] == 0:
            _got(msg)
        else:
            for other, r in list(_hub_links.items()):
                if r == msg["to"]:
                    _send(other, msg)
    elif op == "exit":
        rank = _hub_links.get(s)
        if rank is not None:
            _tell_all(rank, msg["how"], msg.get("detail", ""), but=s)
            _record(rank, msg["how"], msg.get("detail", ""))


def _hub_end(s) -> None:
    rank = _hub_links.pop(s, None)
    if rank is None or rank in left:
        return
    _tell_all(rank, "died", "", but=s)  # first the others, as this process may exit next
    _record(rank, "died")


def _tell_all(rank: int, how: str, detail: str, but=None) -> None:
    for s in list(_hub_links):
        if s is not but:
            _send(s, {"op": "exit", "rank": rank, "how": how, "detail": detail})


# ---------------------------------------------------------------- other ranks: the link
def connect(addr: str, rank: int, timeout: float) -> None:
    """On a rank other than 0, once JAX's runtime is up (so rank 0 is listening)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    _link_socket(s)
    _state.update(rank=rank, hub=s)
    _send(s, {"op": "hello", "rank": rank})
    _sel.register(s, selectors.EVENT_READ, _Lines(_spoke_msg, _spoke_end))
    _ensure_thread()


def _spoke_msg(s, msg) -> None:
    op = msg.get("op")
    if op == "exit":
        _record(int(msg["rank"]), msg["how"], msg.get("detail", ""))
    elif op == "ask":
        _answer(msg, s)
    elif op == "count":
        _got(msg)


def _spoke_end(s) -> None:
    if 0 not in left and not _state["closing"]:
        _record(0, "died")


# ---------------------------------------------------------------- progress questions
def on_progress(fn) -> None:
    """`fn(group_name)` -> how many collectives this rank issued on that group, or None
    when it is not a member (answers `ask` on the links' thread)."""
    _state["progress"] = fn


def ask(group: str, world: int, timeout: float) -> dict | None:
    """How many collectives each live rank of the `world` issued on `group` ({rank:
    count}, this one's included; None for a rank outside the group; ranks that did not
    answer within `timeout` s are missing); None without links (a single process)."""
    if _state["rank"] is None or _state["closing"]:
        return None
    with _news:
        _state["asked"] += 1
        qid = _state["asked"]
        _answers[qid] = {}
    msg = {"op": "ask", "group": group, "id": qid, "from": _state["rank"]}
    if _state["rank"] == 0:
        for s in list(_hub_links):
            _send(s, msg)
    else:
        _send(_state["hub"], msg)
    count = _state["progress"](group) if _state["progress"] else None
    expected = world - len(left)
    with _news:
        if count is not None:
            _answers[qid][_state["rank"]] = count
        _news.wait_for(lambda: len(_answers[qid]) >= expected, timeout)
        return _answers.pop(qid)


def _answer(msg, via) -> None:
    count = _state["progress"](msg["group"]) if _state["progress"] else None
    _send(via, {"op": "count", "id": msg["id"], "to": msg["from"], "rank": _state["rank"],
                "count": count})


def _got(msg) -> None:
    with _news:
        got = _answers.get(msg["id"])
        if got is not None:
            got[int(msg["rank"])] = msg["count"]
            _news.notify_all()


# ---------------------------------------------------------------- leaving
def leaving(how: str, detail: str = "") -> None:
    """This process is about to exit: tell the others how ("ok" or "error")."""
    if _state["closing"]:
        return
    _state["closing"] = True
    _release_held()
    detail = detail[-4000:]
    if _state["rank"] == 0:
        for s in list(_hub_links):
            _send(s, {"op": "exit", "rank": 0, "how": how, "detail": detail})
    elif _state["hub"] is not None:
        _send(_state["hub"], {"op": "exit", "how": how, "detail": detail})


# ---------------------------------------------------------------- the coordinator relay
def relay(upstream: str) -> str:
    """Forward JAX's client to rank 0's coordination service; -> the address to give JAX."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    host, port = upstream.rsplit(":", 1)
    _sel.register(s, selectors.EVENT_READ, lambda ls: _relay_accept(ls, (host, int(port))))
    _ensure_thread()
    return f"127.0.0.1:{s.getsockname()[1]}"


def arm() -> None:
    """JAX's runtime is up: from now on a close from rank 0's side is held back."""
    _state["armed"] = True


def _relay_accept(lsock, upstream) -> None:
    down, _ = lsock.accept()
    try:
        up = socket.create_connection(upstream, timeout=5.0)
    except OSError:
        down.close()  # not up yet: JAX's client retries until its init timeout
        return
    for a in (up, down):
        a.setblocking(True)
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _sel.register(down, selectors.EVENT_READ, lambda a: _pump(a, up, from_jax=True))
    _sel.register(up, selectors.EVENT_READ, lambda a: _pump(a, down, from_jax=False))


def _pump(src, dst, from_jax: bool) -> None:
    try:
        data = src.recv(65536)
    except OSError:
        data = b""
    if data:
        try:
            dst.sendall(data)
        except OSError:
            pass  # the other side closed: its own event ends the pair
        return
    _drop(src)
    if from_jax or not _hold():
        _drop(dst)
        return
    # rank 0's side closed while the job runs: keep JAX's side open, discard what it sends
    _held.append(dst)
    _sel.modify(dst, selectors.EVENT_READ, _discard)


def _hold() -> bool:
    return _state["armed"] and not _state["closing"] and left.get(0, ("",))[0] != "ok"


def _receive(s) -> bytes:
    """What the socket has; b"" when its peer closed it (or it failed), and then the
    socket is dropped."""
    try:
        data = s.recv(65536)
    except OSError:
        data = b""
    if not data:
        _drop(s)
    return data


def _discard(s) -> None:
    _receive(s)


def _release_held() -> None:
    while _held:
        _drop(_held.pop())
