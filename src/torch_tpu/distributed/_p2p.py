"""Point-to-point traffic (send, recv, isend, irecv, batch_isend_irecv) between two ranks.

It does not go through XLA programs. XLA:CPU's collectives run on one gloo communicator
per set of devices, with no tags, so every program over two processes must run in the
same order on both (collectives.py chains them). Point-to-point calls have no such order:
two ranks that exchange data both send first, then receive, and a rank may receive from
one peer while its collectives with others go on. So each pair of ranks gets its own
connection, a 2-rank gloo process group over the job's store, where a rank's k-th send
with a tag meets its peer's k-th receive with that tag, whatever else either does
meanwhile. Data goes through host memory: a copy each way on an accelerator, none to
speak of on XLA:CPU.

Every message is a small header (byte count, dtype, element count), then the bytes: a
receive of the wrong size or dtype is a clear error naming both sides, never a gloo
abort. Sends run on a thread per pair, in order (a send never blocks the caller, as an
exchange where both ranks send first needs); their errors surface at the pair's next use.
A receive blocks until the data is there.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import threading

import torch
import torch.distributed as dist

from .. import _runtime
from . import _bootstrap, _io
from .collectives import explain

_DTYPES = sorted(_runtime.TORCH_TO_JAX, key=str)
_CODE = {d: i for i, d in enumerate(_DTYPES)}


def _describe(header) -> str:
    nbytes, code, numel = (int(v) for v in header)
    dtype = _DTYPES[code] if 0 <= code < len(_DTYPES) else f"dtype #{code}"
    return f"{numel} element(s) of {dtype}"


class Link:
    """The connection between this rank and one peer (global ranks), made at first use."""

    def __init__(self, store, me: int, peer: int, timeout_s: float, name: str):
        self.store, self.me, self.peer = store, me, peer
        self.timeout_s, self.name = timeout_s, name
        self._pg = None
        self._lock = threading.Lock()
        self._pool = None
        self._error = None

    # the peer's rank in the pair's group: the lower global rank is 0
    @property
    def _peer_rank(self) -> int:
        return 0 if self.peer < self.me else 1

    def group(self):
        with self._lock:
            if self._pg is None:
                lo, hi = sorted((self.me, self.peer))
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = datetime.timedelta(seconds=self.timeout_s)
                opts._devices = [dist.ProcessGroupGloo.create_device(
                    hostname=_bootstrap.host())]
                store = dist.PrefixStore(f"tpu_dist/p2p/{lo}-{hi}/", self.store)
                self._pg = dist.ProcessGroupGloo(store, 0 if self.me == lo else 1, 2, opts)
            return self._pg

    def send(self, t: torch.Tensor, tag: int) -> None:
        """Queue t's current value for the peer (XLA buffers are immutable: later writes
        to t do not change what is sent)."""
        self.raise_pending()
        buf, _ = _io.flat_in(t)
        dtype = t.dtype
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"tpu_dist-send-{self.name}")
        self._pool.submit(self._send, buf, dtype, tag)

    def _send(self, buf, dtype, tag) -> None:
        try:
            data = _runtime.to_host(buf, dtype).reshape(-1).view(torch.uint8)
            header = torch.tensor([data.numel(), _CODE[dtype], buf.shape[0]],
                                  dtype=torch.int64)
            pg = self.group()
            pg.send([header], self._peer_rank, tag).wait()
            pg.send([data], self._peer_rank, tag).wait()
        except Exception as e:  # noqa: BLE001  (raised at the pair's next use)
            self._error = e

    def recv(self, t: torch.Tensor, tag: int) -> None:
        """Wait for the peer's next message with `tag` and write it into t."""
        self.raise_pending()
        pg = self.group()
        header = torch.empty(3, dtype=torch.int64)
        try:
            pg.recv([header], self._peer_rank, tag).wait()
            data = torch.empty(int(header[0]), dtype=torch.uint8)
            pg.recv([data], self._peer_rank, tag).wait()
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None
        want = (t.numel() * t.element_size(), _CODE[t.dtype], t.numel())
        if tuple(int(v) for v in header) != want:
            raise ValueError(
                f"tpu_dist recv: rank {self.me} expected {_describe(want)} from rank "
                f"{self.peer}, which sent {_describe(header)}. A recv must match its send's "
                "size and dtype.")
        _io.flat_out(t, _runtime.to_device(data.view(t.dtype)))

    def _failed(self, e: Exception) -> Exception:
        return dist.DistBackendError(
            f"point-to-point with rank {self.peer}: " + explain(str(e)))

    def raise_pending(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise self._failed(e)

    def close(self) -> None:
        """Wait for the queued sends."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.raise_pending()
