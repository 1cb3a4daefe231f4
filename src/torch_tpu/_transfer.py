"""Host <-> device: a tpu tensor's value as a jax array (`materialize`) or a host tensor
(`to_cpu`), and host tensors uploaded into tpu storages (`upload`, `upload_into`).

Debug's checks, the compile backend, the collectives, printing and the PrivateUse1 copy
kernels all move values through here. A read first runs what the current eager mode
deferred (the trigger is counted as a DeferAndFuse flush reason); an upload goes through
the current executor, which may record it instead of calling XLA now.
"""
from __future__ import annotations

import functools

import jax
import torch

from . import _C, _runtime, _storage, _tree, metrics
from .op import asserts, current


@functools.lru_cache(maxsize=4096)
def materializer(shape, stride, offset, blen, bdt, dtype):
    """A jitted reader of one view (shape, strides, offset, dtype) out of a flat buffer of
    blen elements of jax dtype bdt."""
    return jax.jit(_storage.reader(shape, stride, offset, blen, bdt, dtype))


def materialize(t: torch.Tensor, reason: str = "read") -> jax.Array:
    """The value of a tpu tensor as a jax array of its shape (async). `reason` names the
    DeferAndFuse flush trigger in metrics."""
    current.flush_pending(reason)
    buf, n, bdt = _storage.record(t.untyped_storage(), t.dtype)
    if t.is_conj() or t.is_neg():  # a lazy conj()/neg view: resolve it on the device
        t = t.resolve_conj().resolve_neg()
        return materialize(t, reason)
    shape = tuple(t.shape)
    if _is_whole(t, n, bdt):
        return buf.reshape(shape)
    return materializer(shape, tuple(t.stride()), t.storage_offset(), n, bdt, t.dtype)(buf)


def to_device(src: torch.Tensor, index: int) -> torch.Tensor:
    """A copy of tpu tensor `src` on tpu:`index` of a process with several devices:
    PJRT's device-to-device copy of its value, no round trip through a host tensor."""
    with _runtime.on_device(src.device.index):
        value = materialize(src, "device_to_device")
    moved = jax.device_put(value.reshape(-1), _runtime.devices()[index])
    metrics.count("device_to_device")
    with _runtime.on_device(index):
        t, st = _C.empty_with_storage(tuple(src.shape), None, src.dtype)
        _storage.set_buffer(st, moved)
    return t


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
    current.flush_pending(reason)
    buf, n, bdt = _storage.record(t.untyped_storage(), t.dtype)
    if t.is_conj() or t.is_neg() or not _is_whole(t, n, bdt):
        buf = materialize(t, reason)
    out = _runtime.to_host(buf, t.dtype).reshape(t.shape)
    asserts.check()  # a host read is a sync: device-side asserts of the ops finished now
    return out


def host_value(t: torch.Tensor) -> torch.Tensor:
    """The value of a tensor on the host, without counting a device-to-host read (Debug's
    checks read values that the user's program never asked for)."""
    if t.device.type != "tpu":
        return t
    return _runtime.to_host(materialize(t), t.dtype).reshape(t.shape)


_CPU = torch.device("cpu")


def to_cpu_tree(v):
    """An op's argument (tree) for running the op on CPU (the CPU fallback): tpu tensors
    become resizable host copies (out= ops may resize them)."""
    return _tree.convert(v, _fallback_arg, _CPU)


def _fallback_arg(t):
    return to_cpu(t).clone() if t.device.type == "tpu" else t


def upload(src: torch.Tensor) -> torch.Tensor:
    """A CPU tensor -> a new contiguous tpu tensor with the same values."""
    src = src.contiguous()
    dst = torch.empty(src.shape, dtype=src.dtype, device="tpu")
    upload_into(dst.untyped_storage(), src)
    return dst


def upload_into(storage, src: torch.Tensor) -> None:
    """A contiguous CPU tensor's values become the whole storage's buffer, through the
    current executor (DeferAndFuse records small ones as pending nodes)."""
    metrics.count("host_to_device")
    current.executor().upload(storage, src)


def covers_storage(t: torch.Tensor) -> bool:
    """Whether `t` is all of its storage, contiguous from offset 0."""
    return (t.is_contiguous() and t.storage_offset() == 0
            and t.numel() * t.element_size() == t.untyped_storage().nbytes())
