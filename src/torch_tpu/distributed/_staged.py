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
directly. Functional collectives (`_c10d_functional.*`) over such groups get the same
staging from `functional()`, which `_functional.py` calls for any group that is not tpu_dist.

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
  - `recv` from any source waits in the kernel and returns gloo's Work, which names the
    source rank (`dist.recv(src=None)` reads it).

Registering kernels over torch's own is an override of torch internals, written against
torch 2.13.0: `SCHEMAS` holds each op's schema as that version has it. An op whose schema
differs is left to torch (with a warning), and tests/test_gloo_staging.py fails loudly.
"""
from __future__ import annotations

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

_PG = "__torch__.torch.classes.c10d.ProcessGroup"
_W = "__torch__.torch.classes.c10d.Work"
_R = "__torch__.torch.classes.c10d.ReduceOp"
# op name -> (its first argument, its schema in torch 2.13.0)
SCHEMAS = {
    "allreduce_": (INOUT, f"c10d::allreduce_(Tensor[] tensors, {_PG} process_group, {_R} "
                          f"reduce_op, Tensor? sparse_indices, bool async_op=True, int "
                          f"timeout=-1) -> (Tensor[], {_W})"),
    "allreduce_coalesced_": (INOUT, f"c10d::allreduce_coalesced_(Tensor[] tensors, {_PG} "
                                    f"process_group, {_R} reduce_op, bool async_op=True, int "
                                    f"timeout=-1) -> {_W}"),
    "broadcast_": (INOUT, f"c10d::broadcast_(Tensor[] tensors, {_PG} process_group, int "
                          f"root_rank, int root_tensor, bool async_op=True, int timeout=-1) "
                          f"-> (Tensor[], {_W})"),
    "reduce_": (INOUT, f"c10d::reduce_(Tensor[] tensors, {_PG} process_group, {_R} "
                       f"reduce_op, int root_rank, int root_tensor, bool async_op=True, int "
                       f"timeout=-1) -> {_W}"),
    "allgather_": (OUT, f"c10d::allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, "
                        f"{_PG} process_group, bool async_op=True, int timeout=-1) -> "
                        f"(Tensor[][], {_W})"),
    "_allgather_base_": (OUT, f"c10d::_allgather_base_(Tensor output_tensor, Tensor "
                              f"input_tensor, {_PG} process_group, bool async_op=True, int "
                              f"timeout=-1) -> (Tensor, {_W})"),
    "allgather_coalesced_": (OUT, f"c10d::allgather_coalesced_(Tensor[][] output_lists, "
                                  f"Tensor[] input_list, {_PG} process_group, bool "
                                  f"async_op=True) -> {_W}"),
    "allgather_into_tensor_coalesced_": (OUT, f"c10d::allgather_into_tensor_coalesced_("
                                              f"Tensor[] outputs, Tensor[] inputs, {_PG} "
                                              f"process_group, bool async_op=True) -> {_W}"),
    "gather_": (OUT, f"c10d::gather_(Tensor[][] output_tensors, Tensor[] input_tensors, {_PG} "
                     f"process_group, int root_rank, bool async_op=True, int timeout=-1) -> "
                     f"{_W}"),
    "scatter_": (OUT, f"c10d::scatter_(Tensor[] output_tensors, Tensor[][] input_tensors, "
                      f"{_PG} process_group, int root_rank, bool async_op=True, int "
                      f"timeout=-1) -> (Tensor[], {_W})"),
    "reduce_scatter_": (OUT, f"c10d::reduce_scatter_(Tensor[] output_tensors, Tensor[][] "
                             f"input_tensors, {_PG} process_group, {_R} reduce_op, bool "
                             f"async_op=True, int timeout=-1) -> (Tensor[], {_W})"),
    "_reduce_scatter_base_": (OUT, f"c10d::_reduce_scatter_base_(Tensor output_tensor, "
                                   f"Tensor input_tensor, {_PG} process_group, {_R} "
                                   f"reduce_op, bool async_op=True, int timeout=-1) -> "
                                   f"(Tensor, {_W})"),
    "reduce_scatter_tensor_coalesced_": (OUT, f"c10d::reduce_scatter_tensor_coalesced_("
                                              f"Tensor[] outputs, Tensor[] inputs, {_PG} "
                                              f"process_group, {_R} reduce_op, bool "
                                              f"async_op=True, int timeout=-1) -> {_W}"),
    "alltoall_": (OUT, f"c10d::alltoall_(Tensor[] output_tensors, Tensor[] input_tensors, "
                       f"{_PG} process_group, bool async_op=True, int timeout=-1) -> "
                       f"(Tensor[], {_W})"),
    "alltoall_base_": (OUT, f"c10d::alltoall_base_(Tensor output, Tensor input, {_PG} "
                            f"process_group, int[] output_split_sizes, int[] "
                            f"input_split_sizes, bool async_op=True, int timeout=-1) -> {_W}"),
    "barrier": (IN, f"c10d::barrier(Tensor tensor, {_PG} process_group, int[] device_ids, "
                    f"bool async_op=True, int timeout=-1) -> {_W}"),
    "send": (IN, f"c10d::send(Tensor[] tensors, {_PG} process_group, int dst, int tag) -> "
                 f"{_W}"),
    "recv_": (RECV, f"c10d::recv_(Tensor[] tensors, {_PG} process_group, int src, int tag) "
                    f"-> {_W}"),
    "recv_any_source_": (ANY_SOURCE, f"c10d::recv_any_source_(Tensor[] tensors, {_PG} "
                                     f"process_group, int tag) -> {_W}"),
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
            def wait(timeout):
                ok = work.wait(timeout)
                st.write_back(out)
                return ok
            return PythonCallbackWork(wait).boxed()
        work.wait()
        st.write_back(out)
        if first == ANY_SOURCE:
            return boxed
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
        op = getattr(torch.ops.c10d, name).default
        if str(op._schema) != schema:
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
