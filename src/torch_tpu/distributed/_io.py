"""Tensors in and out of collectives: a tensor's value as a flat, process-local XLA buffer,
and a result buffer written back into a tensor.

A tpu tensor that covers its whole storage (the usual case: gradients, DDP buckets,
FSDP's flat buffers) goes in as its storage buffer itself and comes back by replacing that
buffer, with no copy; any other view is read and written through the same static view code
the eager ops use. CPU tensors (object collectives, DDP's metadata checks) are copied to the
device and back.
"""
from __future__ import annotations

import functools
import sys

import jax
import numpy as np
import torch

from .. import _runtime, _storage
from ..op import current


def jax_dtype(t: torch.Tensor):
    return _runtime.jax_dtype(t.dtype)


_NAMES: dict = {}


def dtype_name(t: torch.Tensor) -> str:
    """The jax dtype's name (a program-cache key part): str(np.dtype) costs ~5 us."""
    name = _NAMES.get(t.dtype)
    if name is None:
        name = _NAMES[t.dtype] = str(_runtime.jax_dtype(t.dtype))
    return name


def _covering(t: torch.Tensor, n: int, bdt) -> bool:
    return (t.storage_offset() == 0 and t.numel() == n and bdt == jax_dtype(t)
            and t.is_contiguous())


def flat_in(t: torch.Tensor):
    """(flat local buffer of t's value, whether XLA may reuse that buffer for a result of
    the same size: only when the tensor covers its storage and nothing else holds it)."""
    if t.device.type != "tpu":
        return _runtime.to_device(t.detach().contiguous()), False
    current.flush_pending("collective")
    st = t.untyped_storage()
    rec = _storage.record(st, t.dtype)
    buf = rec[0]
    if isinstance(buf, jax.Array) and _covering(t, rec[1], rec[2]):
        # references: the storage's record, `buf`, getrefcount's argument
        return buf, sys.getrefcount(buf) <= 3
    from .._transfer import materialize

    return _flatten(materialize(t)), False


@functools.lru_cache(maxsize=None)
def _flatten_fn():
    return jax.jit(lambda x: x.reshape(-1))


def _flatten(x):
    return x if x.ndim == 1 else _flatten_fn()(x)


def flat_out(t: torch.Tensor, flat) -> None:
    """Write a flat buffer of t.numel() elements into t."""
    if t.device.type != "tpu":
        host = _runtime.to_host(flat, t.dtype)
        with torch.no_grad():
            t.copy_(host.reshape(t.shape))
        return
    st = t.untyped_storage()
    rec = _storage.record(st, t.dtype)
    if _covering(t, rec[1], rec[2]):
        _storage.set_buffer(st, flat, rec[1], rec[2])
        return
    write = _writer(tuple(t.shape), tuple(t.stride()), t.storage_offset(), rec[1], rec[2],
                    t.dtype)
    _storage.set_buffer(st, write(rec[0], flat), rec[1], rec[2])


@functools.lru_cache(maxsize=1024)
def _writer(shape, stride, offset, n, bdt, dtype):
    return jax.jit(_storage.writer(shape, stride, offset, n, bdt, dtype))


@functools.lru_cache(maxsize=256)
def _slicer(sizes):
    offsets = np.cumsum((0,) + sizes)[:-1].tolist()
    return jax.jit(lambda x: tuple(x[o:o + s] for o, s in zip(offsets, sizes)))


def split(flat, sizes):
    """A flat buffer -> consecutive pieces of `sizes` elements."""
    return list(_slicer(tuple(int(s) for s in sizes))(flat))


def to_numpy_index(values) -> "jax.Array":
    return jax.device_put(np.asarray(values, dtype=np.int32), _runtime.device())
