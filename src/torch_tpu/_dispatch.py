"""The PrivateUse1 kernels written in Python: one kernel per lowered op (and its in-place
and out= variants), copy_ across devices, item(), and the boxed fallback for the tail.

View, empty and resize kernels are C++ (csrc/tpu_ext.cpp): views are half the ops of a
training step and torch's own at::native view kernels do them in under a microsecond.
"""
from __future__ import annotations

import functools
import os
import warnings

import jax
import torch

from . import _C, _runtime, _storage, metrics
from .eager import modes
from .eager.opcall import OpPlan, normalize
from .lowering import decomp, registry

_LIB = torch.library.Library("aten", "IMPL")
_FALLBACK_LIB = torch.library.Library("_", "IMPL")
_PLANS: dict = {}

# ops with hand-written kernels below, never auto-registered from the table
_CUSTOM = {"copy_", "_copy_from", "_copy_from_and_resize", "_local_scalar_dense", "_to_copy",
           "empty", "empty_strided", "resize_", "set_", "as_strided", "view", "_reshape_alias",
           "unfold", "view_as_real", "view_as_complex"}


def plan_for(op) -> OpPlan:
    plan = _PLANS.get(op)
    if plan is None:
        lowering = registry.lookup(op)
        if lowering is None:
            raise NotImplementedError(f"no lowering for {op}")
        plan = _PLANS[op] = OpPlan(op, lowering)
    return plan


def run(op, args, kwargs):
    """Execute an op that has a lowering in the current eager mode."""
    plan = plan_for(op)
    return modes.executor().execute(plan, normalize(plan, args, kwargs))


def _kernel(plan):
    """What `run` does, in C (csrc/kernel.cpp): with the op's entry cached, DeferAndFuse
    records the op without a Python frame."""
    return _C.OpKernel(plan)


def _out_kernel(op, functional):
    """out= variant: compute with the functional op, then resize and copy into `out`."""
    out_names = [a.name for a in op._schema.arguments if a.is_out]
    fplan = plan_for(functional)

    def kernel(*args, **kwargs):
        outs = [kwargs.pop(n) for n in out_names]
        result = modes.executor().execute(fplan, normalize(fplan, args, kwargs))
        results = result if isinstance(result, (tuple, list)) else (result,)
        if len(outs) == 1 and isinstance(outs[0], (list, tuple)):  # Tensor(a!)[] out
            dsts, srcs = outs[0], results
        else:
            dsts, srcs = outs, results
        for dst, src in zip(dsts, srcs):
            if dst.shape != src.shape:
                dst.resize_(src.shape)
            dst.copy_(src)
        if not op._schema.returns:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


def _register_table():
    seen = set()
    packets = {}
    for op in registry.LOWERINGS:
        packets.setdefault(op.overloadpacket, []).append(op)
    for op in list(registry.LOWERINGS):
        _register(op, _kernel(plan_for(op)), seen)
    # derived in-place and out= variants of every lowered functional op
    for packet in packets:
        name = packet.__name__
        ns = getattr(torch.ops, packet._qualified_op_name.split("::")[0])
        for cand_name in {name, name + "_"}:
            cand_packet = getattr(ns, cand_name, None)
            if cand_packet is None:
                continue
            for ov in cand_packet.overloads():
                op = getattr(cand_packet, ov)
                if op in registry.LOWERINGS or op in seen:
                    continue
                functional = registry.functional_variant(op)
                if functional is None or functional not in registry.LOWERINGS:
                    continue
                if any(a.is_out for a in op._schema.arguments):
                    _register(op, _out_kernel(op, functional), seen)
                else:
                    _register(op, _kernel(plan_for(op)), seen)


def _register(op, kernel, seen):
    if op.overloadpacket.__name__ in _CUSTOM or op in _FILLS or op in seen:
        return
    seen.add(op)
    schema = op._schema
    if isinstance(kernel, _C.OpKernel) and _C.register_op_kernel(schema.name, schema.overload_name, kernel):
        return  # the dispatcher calls the C kernel with no Python holder (csrc/tpu_ext.cpp)
    _LIB.impl(op, kernel, "PrivateUse1")


# ---------------------------------------------------------------- copies between devices
@functools.lru_cache(maxsize=4096)
def _materializer(shape, stride, offset, blen, bdt, dtype):
    return jax.jit(_storage.reader(shape, stride, offset, blen, bdt, dtype))


def materialize(t: torch.Tensor, reason: str = "read") -> jax.Array:
    """The value of a tpu tensor as a jax array of its shape (async). `reason` names the
    DeferAndFuse flush trigger in metrics."""
    modes.flush_pending(reason)
    buf, n, bdt = _storage.record(t.untyped_storage(), t.dtype)
    if t.is_conj() or t.is_neg():  # a lazy conj()/neg view: resolve it on the device
        t = t.resolve_conj().resolve_neg()
        return materialize(t, reason)
    shape = tuple(t.shape)
    if _is_whole(t, n, bdt):
        return buf.reshape(shape)
    return _materializer(shape, tuple(t.stride()), t.storage_offset(), n, bdt, t.dtype)(buf)


def _is_whole(t, n, bdt) -> bool:
    """Whether `t` is its storage's whole flat buffer (n elements of jax dtype bdt), in
    order: its value is the buffer, reshaped."""
    return (t.storage_offset() == 0 and n == t.numel() and bdt == _runtime.jax_dtype(t.dtype)
            and t.is_contiguous())


def to_cpu(t: torch.Tensor, reason: str = "to_cpu") -> torch.Tensor:
    """A host copy of a tpu tensor (waits for its value). A tensor that is its whole
    storage is read straight from the storage's buffer: a reshape on the device would be
    one more program, which the device runs after everything queued before it (XLA:CPU
    runs a device's programs in order), so `loss.item()` would wait for the backward and
    optimizer graph flushed just before it instead of for the loss alone."""
    metrics.count("device_to_host")
    modes.flush_pending(reason)
    buf, n, bdt = _storage.record(t.untyped_storage(), t.dtype)
    if t.is_conj() or t.is_neg() or not _is_whole(t, n, bdt):
        buf = materialize(t, reason)
    return _runtime.to_host(buf, t.dtype).reshape(t.shape)


def _upload(src: torch.Tensor) -> torch.Tensor:
    """A CPU tensor -> a new contiguous tpu tensor with the same values."""
    src = src.contiguous()
    dst = torch.empty(src.shape, dtype=src.dtype, device="tpu")
    _upload_into(dst.untyped_storage(), src)
    return dst


_DEFERRED_UPLOAD_MAX_BYTES = 4 << 20


def _upload_into(storage, src: torch.Tensor) -> None:
    """A contiguous CPU tensor's values become the whole storage's buffer. DeferAndFuse
    records small host values as a pending node instead, an argument of the next flushed
    program: no XLA call now (the first call after the device went idle costs ~0.3 ms, and
    a training step's batch upload is such a call). Large ones (weights moved once) go at
    once: a pending upload keeps its host copy until the flush."""
    metrics.count("host_to_device")
    ex = modes.executor()
    if ex.deferred and 0 < src.numel() * src.element_size() <= _DEFERRED_UPLOAD_MAX_BYTES:
        ex.upload(storage, src.dtype, _runtime.host_array(src))
    else:
        _storage.set_buffer(storage, _runtime.to_device(src))


def _covers_storage(t: torch.Tensor) -> bool:
    return (t.is_contiguous() and t.storage_offset() == 0
            and t.numel() * t.element_size() == t.untyped_storage().nbytes())


def copy_(self, src, non_blocking=False):
    if self.device.type == "tpu":
        if src.device.type != "tpu":
            if src.device.type != "cpu":
                raise RuntimeError(f"copy_: cannot copy from {src.device} to tpu")
            if src.shape == self.shape and src.dtype == self.dtype and _covers_storage(self):
                _upload_into(self.untyped_storage(), src.contiguous())
                return self
            src = _upload(src)
        return _copy_kernel()(self, src, non_blocking)
    # tpu -> cpu
    self.copy_(to_cpu(src))
    return self


@functools.cache
def _copy_kernel():
    """tpu -> tpu copy_: the lowered op's C kernel (see _kernel)."""
    return _kernel(plan_for(torch.ops.aten.copy_.default))


def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


def _copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


def _fill_kernel(op, value_of):
    """fill_/zero_ of a tensor that covers its whole storage: the new buffer is a
    constant, made by one XLA call that reads nothing (torch.zeros/ones/full are empty +
    fill_), or in DeferAndFuse a pending constant with no inputs. Other tensors (views,
    conj/neg views) and tensor values take the lowering."""
    plan = plan_for(op)

    def kernel(self, *args):
        ex = modes.executor()
        if not self.is_conj() and not self.is_neg() and _covers_storage(self):
            value = value_of(*args)
            if not isinstance(value, torch.Tensor):
                st = self.untyped_storage()
                if ex.deferred:
                    ex.constant(st, self.dtype, value)
                else:
                    metrics.counters[ex.counter] += 1
                    jdt = _runtime.jax_dtype(self.dtype)
                    n = self.numel()
                    _storage.set_buffer(st, _storage.constant(n, jdt, value), n, jdt)
                return self
        return ex.execute(plan, normalize(plan, (self, *args), {}))

    kernel.__name__ = f"tpu_{plan.name}"
    return kernel


_FILLS = {torch.ops.aten.zero_.default: lambda: 0,
          torch.ops.aten.fill_.Scalar: lambda value: value}


def _local_scalar_dense(self):
    # .item(), and bool()/int()/float() of a tensor (data-dependent Python control flow)
    return to_cpu(self, "item").item()


# ---------------------------------------------------------------- the boxed fallback
_cpu_fallback = [os.environ.get("TORCH_TPU_CPU_FALLBACK", "0") not in ("", "0")]
_warned: set = set()


def set_cpu_fallback(enabled: bool) -> None:
    """Let ops without a lowering run on CPU (counted, warned once per op)."""
    _cpu_fallback[0] = bool(enabled)


def _to_cpu_tree(v):
    if isinstance(v, torch.Tensor) and v.device.type == "tpu":
        return to_cpu(v).clone()  # a resizable host copy: out= ops may resize it
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu_tree(x) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("cpu")
    if isinstance(v, torch.Generator) and v.device.type == "tpu":
        return None
    return v


def _to_tpu_tree(v):
    if isinstance(v, torch.Tensor) and v.device.type == "cpu":
        return _upload(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_tpu_tree(x) for x in v)
    return v


def cpu_fallback(op, args, kwargs, reason):
    name = str(op)
    metrics.fallback_ops[name] += 1
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torch_tpu: {name} has no tpu lowering and runs on CPU ({reason})",
                      stacklevel=3)
    cargs = _to_cpu_tree(list(args))
    ckwargs = {k: _to_cpu_tree(v) for k, v in kwargs.items()}
    out = op(*cargs, **ckwargs)
    # write mutated arguments back to their tpu tensors
    schema = op._schema
    flat_args = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
    flat_cargs = list(cargs) + [ckwargs.get(a.name) for a in schema.arguments[len(args):]]
    results = {}
    for a, orig, cval in zip(schema.arguments, flat_args, flat_cargs):
        if a.alias_info is not None and a.alias_info.is_write and isinstance(orig, torch.Tensor):
            if orig.device.type == "tpu":
                if orig.shape != cval.shape:
                    orig.resize_(cval.shape)
                copy_(orig, cval)
            results[id(cval)] = orig
    return _retarget(out, results)


def _retarget(out, mutated):
    if isinstance(out, torch.Tensor):
        m = mutated.get(id(out))
        return m if m is not None else _upload(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_retarget(o, mutated) for o in out)
    return out


def fallback(op, *args, **kwargs):
    if op in decomp.DECOMPOSITIONS:
        metrics.count("decompositions")
        return decomp.DECOMPOSITIONS[op](*args, **kwargs)
    reason = decomp.CPU_FALLBACKS.get(op)
    if reason is not None:
        return cpu_fallback(op, args, kwargs, reason)
    if _cpu_fallback[0]:
        return cpu_fallback(op, args, kwargs, "enabled by TORCH_TPU_CPU_FALLBACK")
    raise NotImplementedError(
        f"The operator '{op}' is not implemented for the tpu device (torch_tpu has no "
        f"lowering for it). Set TORCH_TPU_CPU_FALLBACK=1 or call "
        f"torch_tpu.set_cpu_fallback(True) to run it on CPU instead (slow).")


def register() -> None:
    _register_table()
    for name, fn in [("copy_", copy_), ("_copy_from", _copy_from),
                     ("_copy_from_and_resize", _copy_from_and_resize),
                     ("_local_scalar_dense", _local_scalar_dense)]:
        _LIB.impl(name, fn, "PrivateUse1")
    for op, value_of in _FILLS.items():
        _LIB.impl(op, _fill_kernel(op, value_of), "PrivateUse1")
    _FALLBACK_LIB.fallback(fallback, "PrivateUse1")
