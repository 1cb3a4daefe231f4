"""tpu tensors over process groups that are not tpu_dist (gloo): staged through the host.

c10d runs a collective of a C++ group (`init_process_group("gloo")`, `new_group(backend=
"gloo")`) by calling a dispatcher op, `c10d::allreduce_` and the like, with the group as an
argument. torch registers one kernel per device key for each
(torch/csrc/distributed/c10d/Ops.cpp); its PrivateUse1 kernel hands the tensors to the
group's backend for that device. Gloo reads tensor memory itself, so it serves CPU and CUDA
only (for CUDA it stages through pinned host memory internally). The kernels here replace
torch's PrivateUse1 ones and do for tpu what gloo does for CUDA:
  - copy the tpu tensors to the host;
  - run the same op on the host copies (torch's CPU kernel: the group's CPU backend);
  - copy the results back into the tpu tensors, in place, as c10d's contract is;
  - return what torch's kernel returns (the output tensors, a Work).
tpu_dist groups never come here: they are Python ProcessGroups whose methods c10d calls
directly. Functional collectives (`_c10d_functional.*`) over a gloo group get the same
staging from `functional()`, which `_functional.py` calls for any group that is not tpu_dist.
Measured between 2 local processes here: an all_reduce of 4 KB takes ~2.4-2.9 ms staged
against ~1.6 ms on CPU tensors; of 4 MB, ~12-13 ms against 4-6 ms (the two copies).

Gloo is also declared a backend of the tpu device (as it is of CUDA), so a gloo group
answers `_get_backend(tpu)`: `batch_isend_irecv`, FSDP2's buffer allocation and
`init_process_group("gloo", device_id=...)` ask it before any collective runs.

Waiting. The copy back must run after the host collective completes, on the caller's
thread: gloo completes its works on threads of its own, and tpu tensors are written through
the calling thread's eager executor. So:
  - a collective waits for its host run inside the kernel and returns a completed Work whose
    future holds the tpu tensors (DDP's reducer reads its bucket from that future). An
    `async_op=True` collective is therefore complete when it returns: it cannot overlap
    with compute, but it has the same results and the same Work API;
  - `send` copies at issue and returns gloo's own Work, not waited: a send that waited in
    the kernel would deadlock two ranks that both send before they receive;
  - `recv` returns at once; its copy back runs in the Work's `wait()`
    (c10d's PythonCallbackWork). Its `get_future()` completes only when `wait()` is called;
  - `recv` from any source waits in the kernel and returns a completed Work that names the
    source rank (`dist.recv(src=None)` reads it).

Registering kernels over torch's own is an override of torch internals, written against
torch 2.13.0: `SCHEMAS` holds each op's schema as that version has it. An op whose schema
differs is left to torch (with a warning), and tests/distributed/test_gloo_staging.py fails loudly.
"""
from __future__ import annotations

import collections
import re
import warnings

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PythonCallbackWork

from .. import _transfer, _tree
from .process_group import _work

_CPU = torch.device("cpu")
_TPU = torch.device("tpu")

# What a c10d op's first argument is; every other tensor argument is an input.
INOUT = "inout"        # read and written: copied down and back
OUT = "out"            # written only (the op overwrites all of it): copied back only
IN = "in"              # read only (send; barrier's placeholder): nothing comes back
RECV = "recv"          # written by a receive: copied back when the Work is waited
ANY_SOURCE = "any"     # written by a receive from any rank: copied back in the kernel


def _schema(text: str) -> str:
    """An op's schema as torch prints it, from `text` with c10d's classes named briefly."""
    return "c10d::" + re.sub(r"\b(ProcessGroup|ReduceOp|Work)\b",
                             r"__torch__.torch.classes.c10d.\1", text)


# op name -> (its first argument, its schema in torch 2.13.0)
SCHEMAS = {
    "allreduce_": (INOUT, _schema(
        "allreduce_(Tensor[] tensors, ProcessGroup process_group, ReduceOp reduce_op, "
        "Tensor? sparse_indices, bool async_op=True, int timeout=-1) -> (Tensor[], Work)")),
    "allreduce_coalesced_": (INOUT, _schema(
        "allreduce_coalesced_(Tensor[] tensors, ProcessGroup process_group, ReduceOp "
        "reduce_op, bool async_op=True, int timeout=-1) -> Work")),
    "broadcast_": (INOUT, _schema(
        "broadcast_(Tensor[] tensors, ProcessGroup process_group, int root_rank, int "
        "root_tensor, bool async_op=True, int timeout=-1) -> (Tensor[], Work)")),
    "reduce_": (INOUT, _schema(
        "reduce_(Tensor[] tensors, ProcessGroup process_group, ReduceOp reduce_op, int "
        "root_rank, int root_tensor, bool async_op=True, int timeout=-1) -> Work")),
    "allgather_": (OUT, _schema(
        "allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, ProcessGroup "
        "process_group, bool async_op=True, int timeout=-1) -> (Tensor[][], Work)")),
    "_allgather_base_": (OUT, _schema(
        "_allgather_base_(Tensor output_tensor, Tensor input_tensor, ProcessGroup "
        "process_group, bool async_op=True, int timeout=-1) -> (Tensor, Work)")),
    "allgather_coalesced_": (OUT, _schema(
        "allgather_coalesced_(Tensor[][] output_lists, Tensor[] input_list, ProcessGroup "
        "process_group, bool async_op=True) -> Work")),
    "allgather_into_tensor_coalesced_": (OUT, _schema(
        "allgather_into_tensor_coalesced_(Tensor[] outputs, Tensor[] inputs, ProcessGroup "
        "process_group, bool async_op=True) -> Work")),
    "gather_": (OUT, _schema(
        "gather_(Tensor[][] output_tensors, Tensor[] input_tensors, ProcessGroup "
        "process_group, int root_rank, bool async_op=True, int timeout=-1) -> Work")),
    "scatter_": (OUT, _schema(
        "scatter_(Tensor[] output_tensors, Tensor[][] input_tensors, ProcessGroup "
        "process_group, int root_rank, bool async_op=True, int timeout=-1) -> "
        "(Tensor[], Work)")),
    "reduce_scatter_": (OUT, _schema(
        "reduce_scatter_(Tensor[] output_tensors, Tensor[][] input_tensors, ProcessGroup "
        "process_group, ReduceOp reduce_op, bool async_op=True, int timeout=-1) -> "
        "(Tensor[], Work)")),
    "_reduce_scatter_base_": (OUT, _schema(
        "_reduce_scatter_base_(Tensor output_tensor, Tensor input_tensor, ProcessGroup "
        "process_group, ReduceOp reduce_op, bool async_op=True, int timeout=-1) -> "
        "(Tensor, Work)")),
    "reduce_scatter_tensor_coalesced_": (OUT, _schema(
        "reduce_scatter_tensor_coalesced_(Tensor[] outputs, Tensor[] inputs, ProcessGroup "
        "process_group, ReduceOp reduce_op, bool async_op=True, int timeout=-1) -> Work")),
    "alltoall_": (OUT, _schema(
        "alltoall_(Tensor[] output_tensors, Tensor[] input_tensors, ProcessGroup "
        "process_group, bool async_op=True, int timeout=-1) -> (Tensor[], Work)")),
    "alltoall_base_": (OUT, _schema(
        "alltoall_base_(Tensor output, Tensor input, ProcessGroup process_group, int[] "
        "output_split_sizes, int[] input_split_sizes, bool async_op=True, int timeout=-1) "
        "-> Work")),
    "barrier": (IN, _schema(
        "barrier(Tensor tensor, ProcessGroup process_group, int[] device_ids, bool "
        "async_op=True, int timeout=-1) -> Work")),
    "send": (IN, _schema(
        "send(Tensor[] tensors, ProcessGroup process_group, int dst, int tag) -> Work")),
    "recv_": (RECV, _schema(
        "recv_(Tensor[] tensors, ProcessGroup process_group, int src, int tag) -> Work")),
    "recv_any_source_": (ANY_SOURCE, _schema(
        "recv_any_source_(Tensor[] tensors, ProcessGroup process_group, int tag) -> Work")),
}


class _Staging:
    """The tpu tensors of one call and their host copies, matched by identity: a tensor
    passed twice gets one copy, as on CPU it is one buffer."""

    __slots__ = ("_host", "_tpu", "_written")

    def __init__(self):
        self._host = {}     # id(tpu tensor) -> its host copy
        self._tpu = {}      # id(host copy) -> (tpu tensor, host copy); keeps both alive
        self._written = set()

    def down(self, v, contents: bool = True):
        """`v` with each tpu tensor replaced by its host copy (made now: with the tensor's
        value when `contents`, else uninitialized)."""
        def host(t):
            if t.device.type != "tpu":
                return t
            h = self._host.get(id(t))
            if h is None:
                h = (_transfer.to_cpu(t, "collective") if contents
                     else torch.empty(t.shape, dtype=t.dtype))
                self._host[id(t)] = h
                self._tpu[id(h)] = (t, h)
            return h
        return _tree.convert(v, host, _CPU)

    def staged(self, h) -> bool:
        return isinstance(h, torch.Tensor) and id(h) in self._tpu

    def originals(self, v):
        """`v` with each host copy made here replaced by its tpu tensor (not written)."""
        return _tree.convert(v, lambda h: self._tpu[id(h)][0] if self.staged(h) else h, _TPU)

    def write_back(self, v) -> None:
        """Copy each host copy in `v` into its tpu tensor (once). As gloo writes CPU tensors:
        outside autograd, and without bumping the version counter."""
        pairs = []

        def collect(h):
            if self.staged(h) and id(h) not in self._written:
                self._written.add(id(h))
                pairs.append(self._tpu[id(h)])
            return h
        _tree.convert(v, collect, _CPU)
        if not pairs:
            return
        targets = tuple(t for t, _ in pairs)
        with torch.no_grad(), torch.autograd.grad_mode._unsafe_preserve_version_counter(targets):
            for t, h in pairs:
                t.copy_(h)


def _future_value(work, st: _Staging, fallback):
    """The value of the host work's future with the tpu tensors in place of their copies
    (DDP's reducer takes its bucket from it); `fallback` for a work without one."""
    try:
        value = work.get_future().value()
    except RuntimeError:  # a gloo work type that keeps no future
        return fallback
    return st.originals(value)


def _copy_back_once(work, st: _Staging, out):
    """A receive's wait(): gloo's own, then the copy back. Only the first call waits for
    gloo, whose receive work waits for a further message each time it is waited."""
    done = []

    def wait(timeout):
        if not done:
            done.append(work.wait(timeout))
            st.write_back(out)
        return done[0]
    return wait


class _Received(dist.Work):
    """A completed receive from any source: `dist.recv(src=None)` waits on it and then asks
    it for the sender. Gloo's own work cannot serve, as each wait of it waits for a
    further message; c10d's completed works know no source rank. It is a Python subclass
    (c10d's PyWork trampoline), which works only while the Python object is alive:
    `_RETURNING` holds each until the caller has it, as the dispatcher carries it back to
    Python as a C++ pointer."""

    def __init__(self, src: int, tensors):
        super().__init__()
        self._src, self._tensors = src, tensors
        _RETURNING.append(self)

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def _source_rank(self):
        return self._src

    source_rank = _source_rank

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut


# The last receives from any source, kept alive until their caller holds them: the
# dispatcher hands each to its caller as soon as the kernel returns, so a short ring will do.
_RETURNING: collections.deque = collections.deque(maxlen=64)


def _c10d_kernel(op, first: str):
    def kernel(*args):
        # Torch drops trailing arguments left at their defaults before calling a Python
        # kernel; passing the rest on unchanged keeps those defaults.
        st = _Staging()
        rest = st.down(args[1:])  # the inputs first: a tensor also in args[0] keeps its value
        out = st.down(args[0], contents=first in (INOUT, IN))
        result = op(out, *rest)
        boxed = result[-1] if isinstance(result, tuple) else result
        if first == IN:
            return result  # gloo's Work holds the host copy until the send completes
        work = dist.Work.unbox(boxed)
        if first == RECV:
            return PythonCallbackWork(_copy_back_once(work, st, out)).boxed()
        work.wait()
        st.write_back(out)
        if first == ANY_SOURCE:
            return _Received(work._source_rank(), args[0]).boxed()
        done = _work(_future_value(work, st, args[0])).boxed()
        return (args[0], done) if isinstance(result, tuple) else done
    kernel.__name__ = f"staged_{op._schema.name.split('::')[1]}"
    return kernel


def functional(op, args, kwargs):
    """A functional collective (`_c10d_functional.*`) on tpu tensors over a group that is
    not tpu_dist: the same op on host copies (torch's kernel: the group's CPU backend),
    waited, with its result brought back: fresh tpu tensors, or for the in-place and out=
    forms the caller's own tensors, written in place. No Work is registered for the
    results, so `wait_tensor` on them returns at once."""
    st = _Staging()
    host_args = st.down(args)
    host_kwargs = {k: st.down(v, contents=False) for k, v in kwargs.items()}  # out=
    result = op(*host_args, **host_kwargs)
    _tree.convert(result, torch.ops._c10d_functional.wait_tensor.default, _CPU)
    st.write_back(result)
    return _tree.convert(result, lambda h: st.originals(h) if st.staged(h) else
                         _transfer.upload(h), _TPU)


_LIB = None
SCHEMA_CHANGED: list = []  # ops left to torch because their schema is not 2.13.0's


def install() -> None:
    """Register the staging kernels (idempotent) and declare gloo a backend of tpu."""
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("c10d", "IMPL")
    for name, (first, schema) in SCHEMAS.items():
        op = getattr(torch.ops.c10d, name).default if hasattr(torch.ops.c10d, name) else None
        if op is None or str(op._schema) != schema:
            SCHEMA_CHANGED.append(name)
            continue
        with warnings.catch_warnings():
            # "Overriding a previously registered kernel": replacing torch's is the point.
            warnings.simplefilter("ignore", UserWarning)
            _LIB.impl(name, _c10d_kernel(op, first), "PrivateUse1")
    if SCHEMA_CHANGED:
        warnings.warn(f"torch_tpu: torch {torch.__version__} changed the c10d ops "
                      f"{SCHEMA_CHANGED}; tpu tensors over gloo groups are not staged for "
                      f"them (written for torch 2.13.0)", stacklevel=2)
    gloo = dist.Backend.backend_capability[dist.Backend.GLOO]
    if "tpu" not in gloo:
        gloo.append("tpu")
