"""The XLA buffer that each tpu storage owns, and how tensors read and write it.

A storage holds one flat 1-D XLA buffer, set as an attribute of the storage's Python
object. That object lives exactly as long as torch's StorageImpl, and every view of the
storage returns the same object, so all views share the buffer and it dies with the last
of them. A tensor is (buffer, shape, strides, offset, dtype); `reader`/`writer` turn that
static description into JAX code that runs inside the op's jitted function.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _C, _runtime
from ._C import Lazy

ATTR = "_xla"


def record(storage, dtype):
    """The storage's (flat buffer, length, jax dtype). A fresh storage gets zeros (the
    memory of torch.empty is unspecified; zeros are a valid choice). Length and dtype are
    kept beside the buffer because reading them off a jax.Array costs ~0.5 us per op."""
    rec = getattr(storage, ATTR, None)
    if rec is None:
        jdt = _runtime.jax_dtype(dtype)
        n = storage.nbytes() // jdt.itemsize
        if _C.multi():  # (on its own device, whichever device reads it first)
            with _runtime.on_device(storage.device.index):
                rec = (zeros(n, jdt), n, jdt)
        else:
            rec = (zeros(n, jdt), n, jdt)
        setattr(storage, ATTR, rec)
        realized(storage)
    return rec


def realized(storage) -> None:
    """Count the storage's bytes as allocated device memory from now on (its buffer exists;
    the allocator reserved them when torch made the storage: _memory.py)."""
    _C.mark_realized(storage)


def zeros(n, dtype):
    """A flat buffer of `n` zeros of jax `dtype`."""
    return constant(n, dtype, 0)


# constants up to 4 MiB are shared (a GPT's logits' zero tangent, 8 x 64 x vocab 256 in
# fp32, is 0.5 MiB): the 64 most recently used, or fewer where they would hold over 32 MiB
SHARED_MAX_BYTES, SHARED_TOTAL_BYTES, SHARED_MAX_COUNT = 1 << 22, 1 << 25, 64
_shared: collections.OrderedDict = collections.OrderedDict()  # key -> (buffer, its bytes)
_shared_bytes = [0]  # their total (summing the buffers' nbytes per new fill cost ~80 µs)


def constant(n, dtype, value):
    """A flat buffer of `n` elements of jax `dtype`, all `value` (a Python number).

    XLA buffers are immutable (every write to a storage makes it a new buffer) and a
    buffer that something else holds is never donated, so small constants are shared: the
    zeros, ones and fills that torch.zeros/ones/full, zeros_like tangents and backward()'s
    ones_like make every step cost a dict lookup instead of an XLA call."""
    dtype = jnp.dtype(dtype)
    buf = shared(n, dtype, value)
    if buf is not None:
        return buf
    share = n * dtype.itemsize <= SHARED_MAX_BYTES and type(value) is not complex
    try:
        if share:  # XLA converts the value, the host broadcasts it: see `_filled`
            buf = jax.device_put(_filled(n, dtype, value), _runtime.device())
        else:
            buf = _constant_fn(n, dtype)(_runtime.scalar_to_device(value))
    except jax.errors.JaxRuntimeError as e:
        _runtime.raise_if_out_of_memory(e, "filling a tensor")
        raise
    if share:
        _shared[_key(n, dtype, value)] = buf, n * dtype.itemsize
        _shared_bytes[0] += n * dtype.itemsize
        while len(_shared) > SHARED_MAX_COUNT or _shared_bytes[0] > SHARED_TOTAL_BYTES:
            _shared_bytes[0] -= _shared.popitem(last=False)[1][1]
    return buf


def shared(n, dtype, value):
    """The buffer `constant` would return, if it is a shared one made already (now the
    most recently used); else None."""
    key = _key(n, jnp.dtype(dtype), value)
    found = _shared.get(key)
    if found is None:
        return None
    _shared.move_to_end(key)
    return found[0]


# Small integer host tensors are shared by value likewise: index lists above all, since
# torch's own indexing makes a tensor on the device of `x[:, [-1]]`'s list, an upload at
# every call (~36 µs in DeferAndFuse, twice a token of nanoGPT's generate); a shared one
# costs a dict lookup. The 256 most recently used, of at most 16 elements each.
UPLOAD_MAX_ELEMENTS, UPLOADS_MAX_COUNT = 16, 256
_uploads: collections.OrderedDict = collections.OrderedDict()  # key -> buffer


def small_upload(cpu):
    """The shared flat buffer of a small integer or bool CPU tensor's values (uploaded now
    if they are new), or None for any other tensor: the executors' `upload` asks first."""
    if (not 0 < cpu.numel() <= UPLOAD_MAX_ELEMENTS or cpu.is_floating_point()
            or cpu.is_complex() or cpu.is_neg()):
        return None
    key = (_slot(), cpu.dtype, cpu.numpy().tobytes())
    buf = _uploads.get(key)
    if buf is None:
        buf = _uploads[key] = _runtime.to_device(cpu)
        if len(_uploads) > UPLOADS_MAX_COUNT:
            _uploads.popitem(last=False)
    else:
        _uploads.move_to_end(key)
    return buf


def _key(n, dtype, value):  # -0.0 == 0.0 (and hashes alike), but 1 / x tells them apart
    sign = math.copysign(1.0, value) if type(value) is float else 0
    slot = _slot()  # (tpu:0's constants keep the short key: several devices per process)
    return (n, dtype, type(value), value, sign) if not slot else (n, dtype, type(value), value, sign, slot)


_slot = _C.slot


def _filled(n, dtype, value) -> np.ndarray:
    """n copies of `value` as XLA converts it to `dtype` (one element made on the device),
    broadcast on the host: one compile per dtype where jnp.full compiles one per size. A
    GPT's first training step made zeros of 10 sizes (AdamW's state, the tangents): each
    compile took 100-260 ms at load 6, the host copy 0.3 ms (GPT cold first step 4.84 s
    against 5.14 s, docs/PERFORMANCE.md)."""
    one = np.asarray(_constant_fn(1, dtype)(_runtime.scalar_to_device(value)))
    return np.full(n, one[0], one.dtype)


def _constant_fn(n, dtype):
    return _placed_constant_fn(n, dtype, _runtime.device())


@functools.lru_cache(maxsize=None)
def _placed_constant_fn(n, dtype, device):
    on_device = jax.sharding.SingleDeviceSharding(device)
    return jax.jit(lambda v: jnp.full((n,), v, dtype), out_shardings=on_device)


def set_buffer(storage, buf, n=None, dtype=None):
    if n is None:
        n, dtype = buf.shape[0], buf.dtype
    prev = getattr(storage, ATTR, None)
    setattr(storage, ATTR, (buf, n, dtype))
    if prev is None or type(prev[0]) is Lazy:
        realized(storage)


def _fit(flat, need):
    """A storage torch grew (resize_, set_) keeps its shorter buffer until next written:
    read the missing tail as zeros."""
    if need > flat.shape[0]:
        return jnp.pad(flat, (0, need - flat.shape[0]))
    return flat


# ---------------------------------------------------------------- static view code
def _bitcast_flat(flat, to_dtype):
    """Reinterpret a flat buffer as another dtype, as torch's x.view(dtype) does."""
    src = flat.dtype
    if src == to_dtype:
        return flat
    if src == jnp.bool_ or to_dtype == jnp.bool_:
        via = jnp.uint8
        flat = flat.astype(via) if src == jnp.bool_ else flat
        out = _bitcast_flat(flat, via if to_dtype == jnp.bool_ else to_dtype)
        return out.astype(jnp.bool_) if to_dtype == jnp.bool_ else out
    # complex: XLA bitcasts only real types; a complex element is its (real, imag) pair
    if jnp.issubdtype(to_dtype, jnp.complexfloating):
        part = jnp.finfo(to_dtype).dtype
        pairs = _bitcast_flat(flat, part)
        pairs = pairs[:pairs.shape[0] // 2 * 2].reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    if jnp.issubdtype(src, jnp.complexfloating):
        pairs = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=1).reshape(-1)
        return _bitcast_flat(pairs, to_dtype)
    a, b = src.itemsize, jnp.dtype(to_dtype).itemsize
    if a == b:
        return lax.bitcast_convert_type(flat, to_dtype)
    if a > b:  # one wide element -> several narrow ones
        return lax.bitcast_convert_type(flat, to_dtype).reshape(-1)
    k = b // a
    n = flat.shape[0] // k * k
    return lax.bitcast_convert_type(flat[:n].reshape(-1, k), to_dtype)


def _cut(flat, offset, n):
    """flat[offset:offset + n], for a static offset or one passed as data (DYNAMIC)."""
    if type(offset) is int:
        return lax.slice(flat, (offset,), (offset + n,))
    return lax.dynamic_slice(flat, (offset,), (n,))


def _dense_chain(shape, stride, offset, buf_len):
    """Express a non-overlapping strided view as slice + reshapes + transpose.

    Returns a function (flat, offset) -> array, or None when the layout needs a gather."""
    dims = [(i, n, s) for i, (n, s) in enumerate(zip(shape, stride)) if n != 1 and s != 0]
    order = sorted(dims, key=lambda d: -d[2])
    if not order:
        return lambda flat, off: _cut(flat, off, 1).reshape(())
    for (_, n_outer, s_outer), (_, n_inner, s_inner) in zip(order, order[1:]):
        if s_outer % s_inner or n_inner * s_inner > s_outer:
            return None
    span = order[0][1] * order[0][2]
    extent = 1 + sum((n - 1) * s for _, n, s in order)

    def read(flat, off):
        # the slice covers whole rows of the outermost stride: past the view's last element
        # it may run off the buffer's end, which reads as zeros that the reshapes drop
        need = (off if type(off) is int else flat.shape[0] - extent) + span
        if need > flat.shape[0]:
            flat = jnp.pad(flat, (0, need - flat.shape[0]))
        x = _cut(flat, off, span)
        x = x.reshape(order[0][1], order[0][2])
        for _, n, s in order[1:]:
            prev = x.shape[-1]
            x = x.reshape(*x.shape[:-1], prev // s, s)[..., :n, :]
        x = x[..., 0]
        # x has the sorted dims; put them back in the tensor's order.
        perm = sorted(range(len(order)), key=lambda k: order[k][0])
        x = jnp.transpose(x, perm) if perm != list(range(len(order))) else x
        return x

    return read


def _gather_index(shape, stride, offset=0):
    idx = np.full((), offset, dtype=np.int64)
    for n, s in zip(shape, stride):
        idx = idx[..., None] + np.arange(n, dtype=np.int64) * s
    return idx


def dense_order(shape, stride):
    """For a non-overlapping, dense layout: the dims from outermost to innermost (a
    permutation); None for anything else (overlapping, gaps, symbolic sizes). Eager ops
    and compiled graphs lay a result's flat buffer out in this order, so that its strides
    are the ones torch's meta kernel gave (an elementwise op keeps its input's layout)."""
    if not all(type(s) is int for s in (*shape, *stride)):
        return None
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], -shape[d]))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return order


def _is_contiguous(shape, stride):
    expected = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


# A view's offset in a key: the number, or DYNAMIC when the program takes it as data (an
# int scalar among the dynamic arguments), so that `source[i:i + bptt]` at every i, or a
# write into a cache at position t, runs one program instead of one per offset.
DYNAMIC = "@"


def offset_is_data(shape, stride, offset, buf_len, buf_dtype, dtype) -> bool:
    """Whether a view's offset goes to the program as data: that of any view of part of
    its buffer (offset 0 too: the first slice `source[0:bptt]` then runs the program of
    every later one), when the buffer holds the view whole in the view's own dtype (so a
    dynamic slice never clamps). The rest (a storage torch grew past its buffer, a
    dtype-reinterpreting view) keeps its offset in the key. csrc/scan.cpp applies the
    same rule."""
    if _runtime.jax_dtype(dtype) != buf_dtype:
        return False
    extent = 1
    for n, s in zip(shape, stride):
        if n == 0:
            return False
        extent += (n - 1) * s
    return offset + extent <= buf_len and (offset > 0 or extent < buf_len)


# DeferAndFuse's read-after-write forwarding (eager/forward.py): while a graph is traced,
# the buffers its writes made, each with (the view written, its offset, the value)
_WRITTEN = [None]


@contextlib.contextmanager
def forwarding():
    _WRITTEN[0] = {}
    try:
        yield
    finally:
        _WRITTEN[0] = None


def note_write(new, shape, stride, dtype, offset, value) -> None:
    """A write of `value` into the view made the flat buffer `new` (inside `forwarding`)."""
    seen = _WRITTEN[0]
    if seen is not None and distinct(shape, stride):
        seen[id(new)] = (new, (shape, stride, dtype), offset, value)


def written(flat, shape, stride, dtype, offset):
    """The value that made `flat` when that write's view is this one at the very same
    offset (a static number, or the same traced parameter), else None."""
    seen = _WRITTEN[0]
    hit = seen.get(id(flat)) if seen else None
    if (hit is None or hit[0] is not flat or hit[1] != (shape, stride, dtype)
            or not (hit[2] is offset or type(offset) is int and hit[2] == offset)):
        return None
    return hit[3]


def distinct(shape, stride) -> bool:
    """Whether no two elements of the view share memory."""
    span = 1
    for s, n in sorted((s, n) for n, s in zip(shape, stride) if n > 1):
        if s < span:
            return False
        span += (n - 1) * s
    return True


@functools.lru_cache(maxsize=4096)
def reader(shape, stride, offset, buf_len, buf_dtype, dtype):
    """(flat buffer[, offset]) -> array of `shape`, for a tensor with these strides into it.
    The offset argument is given when the key's offset is DYNAMIC."""
    shape, stride = tuple(shape), tuple(stride)
    numel = math.prod(shape)
    jdt = _runtime.jax_dtype(dtype)
    convert = (lambda f: f) if buf_dtype == jdt else (lambda f: _bitcast_flat(f, jdt))
    static = offset != DYNAMIC

    if numel == 0:
        return lambda flat, off=offset: jnp.zeros(shape, jdt)
    if _is_contiguous(shape, stride):
        if offset == 0 and numel == buf_len and buf_dtype == jdt:
            return lambda flat, off=offset: flat.reshape(shape)
        if not static:
            return lambda flat, off: lax.dynamic_slice(flat, (off,), (numel,)).reshape(shape)
        return lambda flat, off=offset: _cut(_fit(convert(flat), offset + numel), offset,
                                             numel).reshape(shape)

    chain = _dense_chain(shape, stride, offset, buf_len)
    if chain is not None:
        # stride-0 (expanded) and size-1 dims were dropped by the chain: restore them.
        kept = [i for i, (n, s) in enumerate(zip(shape, stride)) if n != 1 and s != 0]
        dims = tuple(shape[i] if i in kept else 1 for i in range(len(shape)))

        def read(flat, off=offset):
            x = chain(convert(flat), off).reshape(dims)
            return jnp.broadcast_to(x, shape) if x.shape != shape else x

        return read
    idx = _gather_index(shape, stride, offset if static else 0)
    if not static:
        return lambda flat, off: jnp.take(flat, jnp.asarray(idx) + off, mode="clip")
    need = int(idx.max()) + 1
    return lambda flat, off=offset: jnp.take(_fit(convert(flat), need), jnp.asarray(idx),
                                             mode="clip")


@functools.lru_cache(maxsize=4096)
def writer(shape, stride, offset, buf_len, buf_dtype, dtype):
    """(flat buffer, value of `shape`[, offset]) -> new flat buffer with the view
    overwritten. The offset argument is given when the key's offset is DYNAMIC."""
    shape, stride = tuple(shape), tuple(stride)
    numel = math.prod(shape)
    jdt = _runtime.jax_dtype(dtype)
    same = buf_dtype == jdt
    static = offset != DYNAMIC

    def finish(new_flat_in_jdt, old):
        return new_flat_in_jdt if same else _bitcast_flat(new_flat_in_jdt, buf_dtype)

    if numel == 0:
        return lambda flat, value, off=offset: flat
    order = dense_order(shape, stride)
    if order is not None:
        # contiguous, or a dense permutation (an op's result kept in its input's layout):
        # the view is one slice of the buffer, the value in memory order
        def in_memory_order(value):
            if order != sorted(order):
                value = jnp.transpose(value, order)
            return value.reshape(-1).astype(jdt)

        if offset == 0 and numel == buf_len and same:
            return lambda flat, value, off=offset: in_memory_order(value)

        def write_slice(flat, value, off=offset):
            base = flat if same else _bitcast_flat(flat, jdt)
            if static:
                base = _fit(base, offset + numel)
            new = lax.dynamic_update_slice(base, in_memory_order(value), (off,))
            return finish(new, flat)

        return write_slice
    idx = _gather_index(shape, stride, offset if static else 0).reshape(-1)
    need = int(idx.max()) + 1

    def write_scatter(flat, value, off=offset):
        base = _fit(flat if same else _bitcast_flat(flat, jdt), need)
        where = jnp.asarray(idx) if static else jnp.asarray(idx) + off
        new = base.at[where].set(value.reshape(-1).astype(jdt), mode="drop")
        return finish(new, flat)

    return write_scatter
