"""One aten op call turned into a cached, jitted JAX function: the part all eager modes
share.

`OpPlan` holds what is fixed per overload: argument kinds from the schema, which
arguments are mutated, the lowering. `OpPlan.scan` turns one call's arguments into a
cache key (shapes, strides, dtypes, static values, scalar *types*), the storages' flat XLA
buffers and the dynamic scalars. `OpPlan.compile` makes the entry for a new key
(op/build.py): torch's meta kernel gives result shapes, dtypes and memory layouts (and
torch's own error for bad input), and the JAX function reads each input's view out of its buffer, runs the lowering,
casts the results to torch's dtypes, lays each out in its flat buffer in the meta
kernel's memory order and writes mutated views back into their buffers. Scalars stay
traced arguments, so a changing learning rate does not recompile.

Layouts: like CPU and CUDA (TensorIterator, SDPA), a result keeps its input's layout when
the meta kernel says so: `x.transpose(1, 2) * 2` has the transposed strides, so
`.transpose(1, 2).view(B, S, -1)` works as it does on CPU. A result whose meta strides
are a dense permutation of its shape gets those strides (its buffer is written in that
order); any other layout (expanded, overlapping) is contiguous.
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import torch

from .. import _C, _config, _precision, _runtime, _storage
from .._rng import default_generator, draw
from ..lowering.schema import (OPT_TENSOR, OPT_TENSOR_LIST, SCALAR, SCALAR_KEYED, SCALAR_LIST,
                               STATIC, STATIC_NUMBER, TENSOR_LIST, OpSchema, keyed)
from . import build, current, refusals


_SCALARS: dict = {}
_slot = _C.slot


def device_scalar(v):
    """A Python number as a weakly typed device scalar, cached by (type, value).

    jit converts a Python scalar argument into a new device buffer on every call (~7 us);
    a cached weak-typed array promotes exactly like the Python number and costs nothing.
    Learning rates change every step, so the cache is bounded."""
    slot = _slot()  # (several devices per process: each its own scalars; C scans tpu:0's)
    k = (type(v), v) if not slot else (type(v), v, slot)
    a = _SCALARS.get(k)
    if a is None:
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
        a = _SCALARS[k] = _runtime.scalar_to_device(v)
    return a


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _python_scan(plan, vals):
    return None


# TORCH_TPU_C_FAST_PATH=0: no C copy of a Python mechanism runs, only the reference (this
# scan, and the executors' execute for every op: modes.py keeps the op kernels from
# recording in C), so tests can run both and compare
C_FAST_PATH = _config.get("TORCH_TPU_C_FAST_PATH")
# (plan, vals) -> OpPlan.scan's result, or None: see OpPlan.scan
scan_fast = _C.scan if C_FAST_PATH else _python_scan
# (plan, args, kwargs) -> vals: the argument values in schema order, defaults filled in
normalize = _C.normalize
_C.scan_setup(_storage.ATTR, _SCALARS, device_scalar, _storage.DYNAMIC, _runtime.TORCH_TO_JAX)


class CSpec(NamedTuple):
    """What csrc/scan.cpp and csrc/kernel.cpp read of a plan, by position (the field order
    is _C.CONTRACTS["cspec"])."""
    kinds: tuple        # lowering/schema.py's argument kinds
    mutated: tuple      # indices of the arguments the op writes
    python_only: bool   # only OpPlan.scan handles it (seeded ops)
    npos: int           # how many arguments are positional
    names: tuple        # every argument's name
    defaults: tuple     # every argument's default (None where it has none)
    factory: bool       # no tensor argument: the key ends with torch.get_default_dtype()


class DeviceMismatchError(RuntimeError):
    pass


def _own_device() -> str:
    return "tpu:%d" % _C.current_index()  # the op's device (docs/DEVICES.md)


class OpPlan(OpSchema):
    """The schema's facts (lowering/schema.py), the per-key cache, and the scan and
    compile steps of the eager hot path."""

    __slots__ = ("cache", "host_indices", "cspec", "precision", "devices", "held", "apart")

    def __init__(self, op, lowering):
        super().__init__(op, lowering)
        self.cache = {}
        # like CUDA, advanced indexing of a device tensor takes index tensors on the host
        self.host_indices = op._schema.name in _HOST_INDEX_OPS
        self.cspec = CSpec(self.kinds, self.mutable, self.seeded, self.npos, self.names,
                           self.defaults, self.factory)
        # a precision-sensitive op's cache is keyed (key, this snapshot): in C too (kernel.cpp)
        self.precision = _precision.snapshot if lowering in _precision.SENSITIVE else None
        self.devices = None  # index -> this op's plan on tpu:index (on_device)
        self.held = {}  # calls on held tensors, made in C at the capacity (op/capacity.py)
        # not pointwise: its own kernel in XLA's program, what a long graph's compile time
        # is made of (DeferAndFuse's compile-cost guard, eager/defer.py)
        self.apart = torch.Tag.pointwise not in op.tags

    def on_device(self, index: int) -> "OpPlan":
        """This op's plan for tpu:`index` of a process with several devices: the same
        facts with a cache of its own, so its keys (which start with the plan) and programs
        are that device's (csrc/kernel.cpp run_on_devices). tpu:0's is this plan."""
        if index == 0:
            return self
        if self.devices is None:
            self.devices = {}
        plan = self.devices.get(index)
        if plan is None:
            plan = self.devices[index] = copy.copy(self)
            plan.cache, plan.held = {}, {}
            plan.devices = None
        return plan

    def __repr__(self):
        # keys start with the plan (hashed by identity: OpOverload's hash is Python code),
        # and DeferAndFuse's messages print that first element as the op's name
        return str(self.op)

    # ------------------------------------------------------------ per call (hot path)
    def scan(self, vals):
        """-> (key, bufs, dyns): key = (this plan, one part per argument[, shared]).
        Tensors give their view spec, numbers their type.

        The executors call `scan_fast` (csrc/scan.cpp) first: the same key for the common
        case in C, None for what only this Python handles (first touch of a storage,
        other devices, conj/neg views, seeded ops, a storage written through two
        arguments)."""
        parts = []
        bufs = []
        dyns = []
        # in-place ops: every tensor's storage record, to find two written views of one
        # storage (`written`: their positions in recs)
        recs = [] if self.mutable else None
        written = []
        kinds = self.kinds
        gen = None
        for i, v in enumerate(vals):
            k = kinds[i]
            before = len(recs) if recs is not None else 0
            if k == STATIC:
                parts.append(_hashable(v))
            elif k <= OPT_TENSOR:
                parts.append(self._tensor_part(v, bufs, dyns, recs))
            elif k == STATIC_NUMBER:
                parts.append((type(v), v))
            elif k == SCALAR or k == SCALAR_KEYED:
                if v is None or isinstance(v, bool):
                    parts.append(("=", v))
                else:
                    if isinstance(v, torch.Tensor):
                        v = v.item()
                    if k == SCALAR_KEYED and keyed(v):
                        parts.append((type(v), v))  # a constant of the program
                    else:
                        parts.append(type(v))
                        dyns.append(device_scalar(v))
            elif k <= OPT_TENSOR_LIST:
                if self.host_indices:
                    v = _upload_indices(v)
                parts.append(tuple([self._tensor_part(t, bufs, dyns, recs) for t in v]))
            elif k == SCALAR_LIST:
                parts.append(tuple([type(x) for x in v]))
                dyns.extend([device_scalar(x) for x in v])
            else:
                gen = v
                parts.append(None)
            if recs is not None and i in self.mutable:
                written.extend(range(before, len(recs)))
        if self.seeded:
            if gen is None:
                gen = default_generator()
            elif gen.device.type != "tpu":
                raise RuntimeError(
                    f"{self.name}: expected a Generator on device tpu but got one on {gen.device}")
            dyns.extend(draw(gen))
        if self.factory:
            # dtype=None factories follow torch.get_default_dtype()
            parts.append(torch.get_default_dtype())
        if len(written) > 1:
            ids = [id(r) for r in recs]
            if len({ids[j] for j in written}) < len(written):
                # one storage written through several arguments (views of one storage, as
                # in _foreach_copy_ into slices of one flat buffer): the writes must chain.
                # (A storage written and also read through another argument needs nothing:
                # reads see the values from before the op.)
                first: dict = {}
                shared = tuple(first.setdefault(x, b) for b, x in enumerate(ids))
                return (self, tuple(parts), shared), bufs, dyns
        return (self, tuple(parts)), bufs, dyns

    def _tensor_part(self, t, bufs, dyns, recs=None):
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):  # a Python number torch passed for a Tensor
            dyns.append(device_scalar(t))
            return ("#", type(t))
        rec = getattr(t.untyped_storage(), _storage.ATTR, None)
        if rec is None:
            t, rec = self._first_touch(t)
        bufs.append(rec[0])
        if recs is not None:
            recs.append(rec)
        offset = t.storage_offset()
        if _storage.offset_is_data(t.shape, t.stride(), offset, rec[1], rec[2], t.dtype):
            dyns.append(device_scalar(offset))
            offset = _storage.DYNAMIC
        if t.is_conj() or t.is_neg():
            # torch's lazy conj()/_neg_view bits reach the ops that resolve them themselves
            # (copy_, clone, mm, dot, ...): the program applies them to what it reads
            return (t.shape, t.stride(), offset, t.dtype, rec[1], rec[2],
                    (t.is_conj(), t.is_neg()))
        return (t.shape, t.stride(), offset, t.dtype, rec[1], rec[2])

    def _first_touch(self, t):
        """A storage without a buffer: a fresh tpu storage, or a tensor of another device."""
        if t.device.type != "tpu":
            if t.dim() == 0 and t.device.type == "cpu":
                t = t.to("tpu")  # CUDA accepts 0-dim CPU tensors beside device tensors; so do we
            else:
                raise DeviceMismatchError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, {_own_device()} and {t.device}! (when checking argument for "
                    f"{self.name})")
        st = t.untyped_storage()
        rec = getattr(st, _storage.ATTR, None)  # set when t was just uploaded
        if rec is None:  # a fresh storage: zeros (DeferAndFuse records them, allocating nothing)
            rec = current.executor().constant(st, t.dtype)
        return t, rec

    # ------------------------------------------------------------ per new key
    def compile(self, key, vals):
        """The entry of a new key. Bad input raises here, at the call, in every mode:
        torch's rules (refusals.check_call), the meta kernel's, then the lowering's while
        it is traced for the key, as CPU's exception where CPU refuses the call too, else
        as torch's exception classes (refusals.torch_error)."""
        refusals.check_call(self, vals)  # raises CPU's exceptions already
        try:
            return build.entry(self, key, vals)
        except Exception as e:
            mapped = refusals.torch_error(self, e, vals)
            if mapped is None:
                raise
            raise mapped from e

_HOST_INDEX_OPS = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
                   "aten::_unsafe_index", "aten::_unsafe_index_put"}


def _upload_indices(indices):
    return [t.to("tpu") if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t
            for t in indices]
