"""The PrivateUse1 kernels: one per lowered op (and its in-place and out= variants),
copy_ across devices, whole-storage fills, item(), and the boxed fallback for the tail.

A lowered op's kernel is a C object (`_C.OpKernel`, csrc/kernel.cpp) registered as a boxed
C++ kernel (csrc/dispatch.cpp), so the dispatcher calls it with no Python frame; the few
kernels left in Python are the out= variants, the copies, fills and the fallback. View,
empty and resize kernels are C++ too: views are half the ops of a training step and
torch's own at::native view kernels do them in under a microsecond.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch

from . import _C, _config, _runtime, _storage, metrics
from ._transfer import covers_storage, to_cpu, to_cpu_tree, to_device, upload, upload_into
from .op import capacity, current, refusals
from .op.opcall import OpPlan, normalize
from .lowering import decomp, registry

_LIB = torch.library.Library("aten", "IMPL")
_FALLBACK_LIB = torch.library.Library("_", "IMPL")
_PLANS: dict = {}


def plan_for(op) -> OpPlan:
    plan = _PLANS.get(op)
    if plan is None:
        lowering = registry.lookup(op)
        if lowering is None:
            raise NotImplementedError(f"no lowering for {op}")
        plan = _PLANS[op] = OpPlan(op, lowering)
    return plan


def _kernel(plan):
    """What `run` does, in C (csrc/kernel.cpp): with the op's entry cached, DeferAndFuse
    records the op without a Python frame."""
    return _C.OpKernel(plan)


def _out_kernel(op, functional):
    """out= variant: compute with the functional op, then resize and copy into `out`."""
    out_names = [a.name for a in op._schema.arguments if a.is_out]
    fplan = plan_for(functional)
    # a factory's out= variant (arange.out, linspace.out, ...) has no dtype argument: the
    # out tensor's dtype is the one it computes in (arange's int64 step truncates first),
    # and it resizes its out without torch's warning (arange says its own)
    factory = (any(a.name == "dtype" for a in functional._schema.arguments)
               and not any(a.name == "dtype" for a in op._schema.arguments))
    dtype_from_out = factory or op.overloadpacket.__name__ in _OUT_DTYPE_COMPUTES
    mean = op.overloadpacket.__name__ == "mean"  # into an integer out it refuses, as CPU

    def kernel(*args, **kwargs):
        outs = [kwargs.pop(n) for n in out_names]
        if len(outs) == 1 and isinstance(outs[0], (list, tuple)):  # Tensor(a!)[] out
            dsts = outs[0]
        else:
            dsts = outs
        _check_out_devices(dsts, args, kwargs)
        fkwargs = kwargs
        if dtype_from_out and kwargs.get("dtype") is None and (
                dsts[0].dtype.is_floating_point or dsts[0].dtype.is_complex or not mean):
            fkwargs = {**kwargs, "dtype": dsts[0].dtype}
        result = current.executor().execute(_plan_here(fplan), normalize(fplan, args, fkwargs))
        srcs = result if isinstance(result, (tuple, list)) else (result,)
        # torch's out= rules, which computing with the functional op skips
        refusals.check_out(op, functional, srcs, dsts, args, dict(zip(out_names, outs), **kwargs))
        for dst, src in zip(dsts, srcs):
            if factory:
                _factory_resize(op, dst, src.shape)
            else:
                resize_output(dst, src.shape)
            dst.copy_(src)
        if not op._schema.returns:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return _on_inputs_device(kernel)


# reductions and scans whose out= with dtype=None computes in the out's dtype, as CPU does
# (it casts the input first: the int64 sum of 0.6 and 1.7 is 1, not 2)
_OUT_DTYPE_COMPUTES = frozenset({"sum", "mean", "prod", "nansum", "cumsum", "cumprod"})


def _factory_resize(op, out, shape) -> None:
    """A factory's out= resize: silent, but for arange's own warning (RangeFactories.cpp)."""
    n = math.prod(shape)
    if op.overloadpacket.__name__ == "arange" and out.numel() and out.numel() != n:
        warnings.warn(
            f"The number of elements in the out tensor of shape {list(out.shape)} is "
            f"{out.numel()} which does not match the computed number of elements {n}. Note "
            f"that this may occur as a result of rounding error. The out tensor will be "
            f"resized to a tensor of shape ({n},).", stacklevel=3)
    if out.shape != shape:
        out.resize_(shape)


def _check_out_devices(outs, args, kwargs) -> None:
    """An out= tensor on another device than the computation's (its first tpu input's; a
    factory's is its out's) is refused, as torch refuses it."""
    index = _tpu_index(*args, *kwargs.values())
    for dst in outs:
        for t in dst if isinstance(dst, (list, tuple)) else (dst,):
            if isinstance(t, torch.Tensor) and (
                    t.device.type != "tpu" or index >= 0 and t.device.index != index):
                where = torch.device("tpu", max(index, 0))
                raise RuntimeError(f"Expected out tensor to have device {where}, but got "
                                   f"{t.device} instead")


def resize_output(out, shape) -> None:
    """torch's resize of an out= tensor (at::native::resize_output): a tensor of the right
    shape keeps its strides; one of another shape is resized, with torch's deprecation
    warning when it had elements."""
    if out.shape == shape:
        return
    if out.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
            f"This behavior is deprecated, and in a future PyTorch release outputs will not be "
            f"resized unless they have zero elements. You can explicitly reuse an out tensor t "
            f"by resizing it, inplace, to zero elements with t.resize_(0).", stacklevel=3)
    out.resize_(shape)


def _resize_output_(self, size, device):
    if self.device != device:
        raise RuntimeError("out Tensor doesn't have the correct device set")
    resize_output(self, torch.Size(size))
    return self


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
    for op, functional in registry.OUT_OF_COMPOSITE.items():
        _register(op, _out_kernel(op, functional), seen)


def register_op(op) -> None:
    """The PrivateUse1 kernel of an op whose lowering joined the table after import
    (torch_tpu.jax_op): the C kernel every lowered op has."""
    schema = op._schema
    if not _C.register_op_kernel(schema.name, schema.overload_name, _kernel(plan_for(op))):
        raise TypeError(f"{op}: the tpu kernel cannot take the argument types of {schema}")


def _register(op, kernel, seen):
    if op.overloadpacket.__name__ in _HAND_WRITTEN or op in _FILLS or op in seen:
        return
    seen.add(op)
    schema = op._schema
    if isinstance(kernel, _C.OpKernel) and _C.register_op_kernel(schema.name, schema.overload_name, kernel):
        return  # the dispatcher calls the C kernel with no Python holder (csrc/dispatch.cpp)
    _LIB.impl(op, kernel, "PrivateUse1")


# ---------------------------------------------------------------- copies between devices
def _tpu_index(*values) -> int:
    """The device of the first tpu tensor among `values` (lists looked into), else -1."""
    for v in values:
        if isinstance(v, (list, tuple)):
            found = _tpu_index(*v)
            if found >= 0:
                return found
        elif isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return v.device.index
    return -1


def _on_inputs_device(kernel):
    """A Python kernel run with its first tpu tensor's device current, as the C op kernels
    run theirs (several devices per process; one: the kernel as it is)."""
    def on_device(*args, **kwargs):
        if not _multi():
            return kernel(*args, **kwargs)
        with _runtime.on_device(_tpu_index(*args, *kwargs.values())):
            return kernel(*args, **kwargs)

    on_device.__name__ = kernel.__name__
    return on_device


_multi = _C.multi


def _plan_here(plan):
    """The op's plan for the current device (OpPlan.on_device)."""
    return plan.on_device(_C.slot())


def copy_(self, src, non_blocking=False):
    if self.device.type == "tpu" and _multi():  # (several devices per process)
        if src.device.type == "tpu" and src.device != self.device:
            src = to_device(src, self.device.index)
        with _runtime.on_device(self.device.index):
            return _copy(self, src, non_blocking)
    return _copy(self, src, non_blocking)


def _copy(self, src, non_blocking):
    if self.device.type == "tpu":
        if src.device.type != "tpu":
            if src.device.type != "cpu":
                raise RuntimeError(f"copy_: cannot copy from {src.device} to tpu")
            if src.shape == self.shape and src.dtype == self.dtype and covers_storage(self):
                upload_into(self.untyped_storage(), src.contiguous())
                return self
            src = upload(src)
        ex = current.executor()
        write = getattr(ex, "write_in_place", None)  # (Strict only)
        if write is not None and write(_copy_plan(), self, src):
            return self
        st = self.untyped_storage()
        if getattr(st, _storage.ATTR, None) is None and not capacity.holds(src):
            # a fresh destination (`x.float()`: empty, then copy_) gets its zeros here, as
            # the scan's first touch would, so that the copy takes the ops' C path: 34 ->
            # 15 us in DeferAndFuse. (A held source's copy is op/lengths.py's, at its
            # capacity, and keeps the fresh destination for it.)
            ex.constant(st, self.dtype)
        return _copy_kernel()(self, src, non_blocking)
    # tpu -> cpu
    self.copy_(to_cpu(src))
    return self


@functools.cache
def _copy_plan():
    return plan_for(torch.ops.aten.copy_.default)


@functools.cache
def _copy_kernel():
    """tpu -> tpu copy_: the lowered op's C kernel (see _kernel)."""
    return _kernel(_copy_plan())


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
    conj/neg views) take the lowering; fill_.Tensor is lowered as any op."""
    plan = plan_for(op)

    def kernel(self, *args):
        ex = current.executor()
        value = value_of(*args)
        if value not in (0, 1):
            value = _fill_value(self.dtype, value)
        if not self.is_conj() and not self.is_neg() and covers_storage(self):
            ex.fill(self.untyped_storage(), self.dtype, value)
            return self
        return ex.execute(_plan_here(plan), normalize(plan, (self, *((value,) if args else ())), {}))

    kernel.__name__ = f"tpu_{plan.name}"
    return _on_inputs_device(kernel)


@functools.lru_cache(maxsize=1024, typed=True)  # a mask's -inf, every step: ~0.2 us, not 3
def _fill_value(dtype, value):
    """`value` as fill_ takes it into `dtype`, or torch's checked conversion's error, as on
    CPU and CUDA: "value cannot be converted to type ... without overflow" (a 1-element
    CPU fill_ skips the check). Ints convert as torch converts them (past int64 too)."""
    torch.empty(2, dtype=dtype).fill_(value)
    if type(value) is int and (dtype.is_floating_point or dtype.is_complex):
        return float(value)
    return bool(value) if type(value) is int and dtype == torch.bool else value


_FILLS = {torch.ops.aten.zero_.default: lambda: 0,
          torch.ops.aten.fill_.Scalar: lambda value: value}


def _local_scalar_dense(self):
    # .item(), and bool()/int()/float() of a tensor (data-dependent Python control flow)
    return to_cpu(self, "item").item()


# ---------------------------------------------------------------- the boxed fallback
_cpu_fallback = [_config.get("TORCH_TPU_CPU_FALLBACK")]
_warned: set = set()


def set_cpu_fallback(enabled: bool) -> None:
    """Let ops without a lowering run on CPU (counted, warned once per op)."""
    _cpu_fallback[0] = bool(enabled)


def cpu_fallback(op, args, kwargs, reason):
    name = str(op)
    # (the host copy below would accept a CPU out)
    _check_out_devices([kwargs.get(a.name) for a in op._schema.arguments if a.is_out], args,
                       kwargs)
    metrics.fallback_ops[name] += 1
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torch_tpu: {name} has no tpu lowering and runs on CPU ({reason})",
                      stacklevel=3)
    cargs = to_cpu_tree(list(args))
    ckwargs = {k: to_cpu_tree(v) for k, v in kwargs.items()}
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
        return m if m is not None else upload(out)
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


# The ops whose kernels are hand-written, never registered from the lowering table: the
# Python ones above, and the C++ ones (views, empty, resize_, set_), which csrc/tpu_ext.cpp
# registers and lists as it does so.
_PYTHON_KERNELS = {"copy_": copy_, "_copy_from": _copy_from,
                   "_copy_from_and_resize": _copy_from_and_resize,
                   "_local_scalar_dense": _local_scalar_dense,
                   "_resize_output_": _resize_output_}
_HAND_WRITTEN = frozenset(_PYTHON_KERNELS) | frozenset(_C.NATIVE_KERNELS)


def register() -> None:
    _register_table()
    for name, fn in _PYTHON_KERNELS.items():
        _LIB.impl(name, fn, "PrivateUse1")
    for op, value_of in _FILLS.items():
        _LIB.impl(op, _fill_kernel(op, value_of), "PrivateUse1")
    _FALLBACK_LIB.fallback(fallback, "PrivateUse1")
