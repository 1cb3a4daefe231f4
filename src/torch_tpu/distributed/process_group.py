"""`ProcessGroupTPU`: the c10d process group of the `tpu_dist` backend.

It subclasses `torch.distributed.ProcessGroup` (a Python subclass of c10d's `Backend`
cannot be constructed), so torch.distributed's Python API calls these methods directly,
and C++ callers (DDP's reducer, some functional collectives) reach them through c10d's
Python trampoline. Each collective becomes one XLA program over the group's mesh
(`collectives.py`), issued asynchronously: the result tensors hold XLA futures, so a
collective never blocks the host, like a collective on a CUDA stream. Works complete at
once from the host's view; `barrier()` is the one call that waits. Point-to-point calls
go over a connection per pair of ranks instead (`_p2p.py`): a send is queued, a receive
waits for its data.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .. import _storage
from . import _bootstrap, _io, _sockets, _watchdog, collectives as C

# Donating a buffer makes the dispatch wait until the buffer's producer has finished, so
# the host stops running ahead of the device; worth it only where a fresh output would
# cost page faults (large buffers).
_DONATE_MIN_BYTES = 1 << 20


def _red(opts) -> tuple[int, object]:
    """(the reduce op's code, PREMUL_SUM's factor or None). PREMUL_SUM (FSDP2 reduce-
    scatters with it after `set_gradient_divide_factor`) is SUM of the inputs each
    multiplied by the factor first, a number or a tensor, as NCCL defines it."""
    op = getattr(opts, "reduceOp", opts)
    code = int(getattr(op, "op", op))
    if code == C.PREMUL_SUM:
        return C.SUM, op.factor
    return code, None


def _scaled(tensors, factor):
    """The inputs of a PREMUL_SUM, multiplied by its factor (new tensors: the caller's
    inputs stay as they are)."""
    return tensors if factor is None else [t * factor for t in tensors]


def _work(result=None):
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _check_p2p(tensors, what):
    if len(tensors) != 1:
        raise ValueError(f"tpu_dist {what} takes exactly one tensor, got {len(tensors)}")


class ProcessGroupTPU(dist.ProcessGroup):
    """One process per device; collectives are XLA collectives across processes."""

    def __init__(self, rank: int, size: int, ranks, timeout_s: float, name: str = "",
                 store=None):
        super().__init__(rank, size)
        self._ranks = list(ranks)
        self._store = store
        self._timeout_s = float(timeout_s)
        self._group_name = name
        self._group_desc = ""
        self._mesh = None
        self._p2p = {}
        self._seq = 0

    # ------------------------------------------------------------ identity
    def getBackendName(self):  # noqa: N802  (c10d's names)
        return "tpu_dist"

    # c10d asks a group for its backend per device (init_process_group(device_id=...) asks
    # whether that backend can split, for eager initialization). This group is its own
    # backend, already connected when it is made (JAX's runtime starts in the creator);
    # it cannot split communicators, coalesce or estimate times.
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def _get_backend(self, device):  # noqa: D401
        return self

    def getGroupName(self):  # noqa: N802
        return self._group_name

    def setGroupName(self, name):  # noqa: N802
        self._group_name = name
        if self._mesh is not None:
            self._mesh.name = name

    def getGroupDesc(self):  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc):  # noqa: N802
        self._group_desc = desc

    def __repr__(self):
        return f"ProcessGroupTPU(name={self._group_name!r}, ranks={self._ranks}, rank={self.rank()})"

    @property
    def global_ranks(self) -> list:
        return list(self._ranks)

    def mesh(self) -> C.GroupMesh:
        if self._mesh is None:
            self._mesh = C.GroupMesh(self._ranks, self._group_name)
        return self._mesh

    # ------------------------------------------------------------ issuing
    def _issue(self, gm, kind, blocks, ins, outs, op=C.SUM, root=0, extra=None, donate=(),
               sig=None, alias=0):
        _bootstrap.raise_if_failed()  # after a failure (kept, not fatal) nothing is issued
        prog = C.program(gm, kind, ins, outs, op, root, extra, donate, sig, alias)
        before = _sockets.first_collective(gm.ranks)
        self._seq += 1
        seq, name, ranks = self._seq, gm.name, gm.ranks
        entry = _watchdog.begin(
            gm, lambda: f"{kind} #{seq} on group {name!r} (ranks {list(ranks)})",
            self._timeout_s)
        try:
            results = C.run(gm, prog, blocks)
        except BaseException as e:
            _watchdog.cancel(entry)
            if _watchdog.is_runtime_error(e):  # a peer is gone, or an input came from a
                raise _watchdog.dispatch_failed(entry, e) from None  # failed collective
            raise
        if before is not None:  # the sockets it opened, once it ran (_sockets.py)
            entry.on_done = functools.partial(_sockets.adopt, before)
        entry.issued()  # (the watchdog looks at the entry from here on)
        return results

    def _inputs(self, tensors, allow_donate=True):
        blocks, ins, donate = [], [], []
        for i, t in enumerate(tensors):
            buf, ok = _io.flat_in(t)
            blocks.append(buf)
            ins.append((t.numel(), _io.dtype_name(t)))
            if ok and allow_donate and t.numel() * t.element_size() >= _DONATE_MIN_BYTES:
                donate.append(i)
        return blocks, tuple(ins), tuple(donate)

    def _inplace(self, kind, tensors, op=C.SUM, root=0):
        tensors = [t for t in tensors if t.numel() > 0]
        if not tensors:
            return
        blocks, ins, donate = self._inputs(tensors)
        outs = self._issue(self.mesh(), kind, blocks, ins, ins, op, root, donate=donate)
        for t, flat in zip(tensors, outs):
            _io.flat_out(t, flat)

    # ------------------------------------------------------------ reductions
    def allreduce(self, tensors, opts=None):
        op, factor = _red(opts) if opts is not None else (C.SUM, None)
        if factor is not None:  # (all_reduce writes its inputs: scale them where they are)
            for t in tensors:
                t.mul_(factor)
        self._inplace("all_reduce", tensors, op)
        return _work(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op, factor = _red(opts)
        if factor is None:
            self._inplace("reduce", tensors, op, opts.rootRank)
            return _work(tensors)
        scaled = _scaled(tensors, factor)  # the other ranks' tensors stay as they are
        self._inplace("reduce", scaled, op, opts.rootRank)
        if self.rank() == opts.rootRank:
            for t, r in zip(tensors, scaled):
                t.copy_(r)
        return _work(tensors)

    def broadcast(self, tensors, opts):
        self._inplace("broadcast", tensors, C.SUM, opts.rootRank)
        return _work(tensors)

    # ------------------------------------------------------------ gathers
    def allgather(self, output_lists, input_tensors, opts=None):
        for outs, inp in zip(output_lists, input_tensors):
            self._check_list(outs, inp, "all_gather")
            flats = self._gather(inp, split=True)
            for t, flat in zip(outs, flats):
                _io.flat_out(t, flat)
        return _work(output_lists)

    def _check_list(self, tensors, like, what):
        if len(tensors) != self.size():
            raise ValueError(f"tpu_dist {what}: expected a list of {self.size()} tensors "
                             f"(the group size), got {len(tensors)}")
        for t in tensors:
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise ValueError(f"tpu_dist {what}: every tensor of the list must have "
                                 f"{like.numel()} elements of {like.dtype}, got "
                                 f"{tuple(t.shape)} {t.dtype}")

    def _gather(self, inp, split, kind="all_gather", out=None):
        blocks, ins, _ = self._inputs([inp], allow_donate=False)
        n, dt = ins[0]
        w = self.size()
        outs = ((n, dt),) * w if split else ((n * w, dt),)
        alias = 0
        if out is not None and n * w * out.element_size() >= _DONATE_MIN_BYTES:
            buf, ok = _io.flat_in(out)
            if ok:  # the old output buffer becomes the result's memory
                blocks.append(buf)
                ins = ins + ((n * w, dt),)
                alias = 1
        return self._issue(self.mesh(), kind, blocks, ins, outs,
                           extra="split" if split else None,
                           donate=(1,) if alias else (), alias=alias)

    def all_gather_single(self, output, inp, opts=None):
        if output.numel() != inp.numel() * self.size() or output.dtype != inp.dtype:
            raise ValueError(
                f"tpu_dist all_gather_into_tensor: the output must have group size "
                f"({self.size()}) x {inp.numel()} elements of {inp.dtype}, got "
                f"{tuple(output.shape)} {output.dtype}")
        if inp.numel():
            (flat,) = self._gather(inp, split=False, out=output)
            _io.flat_out(output, flat)
        return _work([output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for out, inp in zip(outputs, inputs):
            self.all_gather_single(out, inp, opts)
        return _work(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        for outs, inp in zip(output_lists, inputs):
            self.allgather([outs], [inp], opts)
        return _work(output_lists)

    def gather(self, output_lists, input_tensors, opts):
        inp = input_tensors[0]
        root = opts.rootRank
        is_root = self.rank() == root
        if is_root:
            self._check_list(output_lists[0], inp, "gather")
        elif output_lists and output_lists[0]:
            raise ValueError("tpu_dist gather: only the root passes a gather_list")
        if inp.numel():
            flats = self._gather(inp, split=True, kind="gather")
            if is_root:
                for t, flat in zip(output_lists[0], flats):
                    _io.flat_out(t, flat)
        return _work(output_lists)

    # ------------------------------------------------------------ scatters
    def scatter(self, output_tensors, input_lists, opts):
        out = output_tensors[0]
        root = opts.rootRank
        n, dt = out.numel(), _io.jax_dtype(out)
        dname = _io.dtype_name(out)
        if self.rank() == root:
            self._check_list(input_lists[0], out, "scatter")
            blocks, ins, _ = self._inputs(input_lists[0], allow_donate=False)
        else:
            if input_lists and input_lists[0]:
                raise ValueError("tpu_dist scatter: only the root passes a scatter_list")
            blocks = [_storage.zeros(n, dt)] * self.size()
            ins = ((n, dname),) * self.size()
        if n:
            (flat,) = self._issue(self.mesh(), "scatter", blocks, ins, ((n, dname),),
                                  root=root)
            _io.flat_out(out, flat)
        return _work(output_tensors)

    def reduce_scatter(self, output_tensors, input_lists, opts):
        op, factor = _red(opts)
        for out, inputs in zip(output_tensors, input_lists):
            self._check_list(inputs, out, "reduce_scatter")
            if out.numel():
                blocks, ins, _ = self._inputs(_scaled(inputs, factor), allow_donate=False)
                (flat,) = self._issue(self.mesh(), "reduce_scatter", blocks, ins,
                                      ((out.numel(), ins[0][1]),), op)
                _io.flat_out(out, flat)
        return _work(output_tensors)

    def reduce_scatter_single(self, output, inp, opts):
        if inp.numel() != output.numel() * self.size() or output.dtype != inp.dtype:
            raise ValueError(
                f"tpu_dist reduce_scatter_tensor: the input must have group size "
                f"({self.size()}) x {output.numel()} elements of {output.dtype}, got "
                f"{tuple(inp.shape)} {inp.dtype}")
        if output.numel():
            op, factor = _red(opts)
            blocks, ins, _ = self._inputs(_scaled([inp], factor), allow_donate=False)
            (flat,) = self._issue(self.mesh(), "reduce_scatter", blocks, ins,
                                  ((output.numel(), ins[0][1]),), op)
            _io.flat_out(output, flat)
        return _work([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs):
            self.reduce_scatter_single(out, inp, opts)
        return _work(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------ all-to-all
    def all_to_all_single(self, output, inp, output_splits, input_splits, opts=None):
        from ._alltoall import all_to_all_single

        all_to_all_single(self, output, inp, list(output_splits), list(input_splits))
        return _work([output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        from ._alltoall import all_to_all_lists

        all_to_all_lists(self, output_tensors, input_tensors)
        return _work(output_tensors)

    # ------------------------------------------------------------ point to point
    # Through a connection per pair of ranks, outside XLA's collectives (see _p2p.py).
    def _link(self, peer: int):
        self._check_peer(peer)
        link = self._p2p.get(peer)
        if link is None:
            from ._p2p import Link

            if self._store is None:
                raise RuntimeError("tpu_dist: this group was made without a store, so it "
                                   "cannot connect pairs of ranks for send/recv")
            link = self._p2p[peer] = Link(self._store, self._ranks[self.rank()],
                                          self._ranks[peer], self._timeout_s,
                                          f"{self._group_name}:{self.rank()}-{peer}")
        return link

    def _check_peer(self, peer: int) -> None:
        if peer == self.rank():
            raise ValueError("tpu_dist: a rank cannot send to or receive from itself")
        if not 0 <= peer < self.size():
            raise ValueError(f"tpu_dist: peer rank {peer} is not in the group (size {self.size()})")

    def send(self, tensors, dst, tag=0):
        _check_p2p(tensors, "send")
        link = self._link(dst)
        if tensors[0].numel():
            link.send(tensors[0], tag)
        return _work(tensors)

    def recv(self, tensors, src, tag=0):
        _check_p2p(tensors, "recv")
        link = self._link(src)
        if tensors[0].numel():
            link.recv(tensors[0], tag)
        return _work(tensors)

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError(
            "tpu_dist: recv without a source (src=None) is not supported: an XLA transfer "
            "needs both ends known when it is issued. Pass src=.")

    # ------------------------------------------------------------ synchronization
    def barrier(self, opts=None):
        gm = self.mesh()
        self._issue(gm, "barrier", [], (), ())
        _watchdog.wait(gm, self._timeout_s, f"barrier on group {gm.name!r}")
        return _work(None)

    def _set_default_timeout(self, timeout) -> None:
        """The timeout of the collectives issued from now on (dist._set_pg_timeout)."""
        self._timeout_s = timeout.total_seconds()

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        gm = self.mesh()
        self._issue(gm, "barrier", [], (), ())
        t = timeout.total_seconds() if timeout is not None else self._timeout_s
        _watchdog.wait(gm, t, f"monitored_barrier on group {gm.name!r}")

    def _start_coalescing(self, device):
        pass

    def _end_coalescing(self, device):
        return _work(None)

    def shutdown(self):
        for link in self._p2p.values():
            link.close()

    def abort(self):
        pass
