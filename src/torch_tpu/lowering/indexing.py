"""Indexing: advanced indexing and index_put, gather/scatter, the index_* family, take/put,
masked_scatter, searchsorted/bucketize, and the ops whose result shape depends on values
(nonzero, masked_select, unique, repeat_interleave).

Data-dependent shapes: XLA programs have static shapes, so `nonzero` & co. cannot run inside
jit. Their lowerings use jnp's value-dependent forms (jnp.nonzero without `size=`), which
work on concrete arrays; the executor runs ops whose shapes it cannot derive (tag
`dynamic_output_shape`, no usable meta kernel) eagerly on concrete arrays. On a tracer they
raise JAX's ConcretizationTypeError, which is how the executor tells them apart.
Writing through a boolean mask (index_put, masked_scatter) needs no such thing: the mask
selects positions of a fixed-shape result, so those lowerings stay static.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import bounds
from ._dtypes import scalar_type_name
from .registry import aten, index_bounds, lowering


def _dim(d, ndim):
    return d + ndim if d < 0 else d


def _is_mask(i):
    # uint8 indices are masks too (deprecated in torch, still accepted)
    return i is not None and i.dtype in (jnp.bool_, jnp.uint8)


def _accumulate_dtype(dtype):
    """Sums of low-precision floats accumulate in float32, then round once; bool sums
    accumulate as integers (torch's bool add is a logical or: nonzero -> True)."""
    if dtype in (jnp.bfloat16, jnp.float16):
        return jnp.float32
    if dtype == jnp.bool_:
        return jnp.int64
    return dtype


# ---------------------------------------------------------------- index / index_put
def _expand_masks(indices):
    """Replace each boolean mask by one integer index per dim it covers (torch's rule).
    Needs concrete masks: the number of True entries is the result's size."""
    out = []
    for i in indices:
        if _is_mask(i):
            out.extend(jnp.nonzero(i))
        else:
            out.append(i)
    return out


def _indexer(indices):
    return tuple(slice(None) if i is None else i for i in indices)


@lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
@index_bounds(bounds.advanced)
def _index(self, indices):
    # jnp advanced indexing follows numpy's rules, which are torch's: adjacent index
    # tensors put their broadcast shape in place, separated ones put it first
    return self[_indexer(_expand_masks(indices))]


def _only_leading_mask(self, indices):
    """The mask of `x[mask] = v` / `x[:, mask] = v`: one mask, only full slices around it."""
    masks = [i for i in indices if _is_mask(i)]
    others = [i for i in indices if i is not None and not _is_mask(i)]
    if len(masks) != 1 or others:
        return None, 0
    pos = next(p for p, i in enumerate(indices) if _is_mask(i))
    return masks[0].astype(jnp.bool_), pos


def _masked_put(self, mask, pos, values, accumulate):
    """`self[(:,)*pos + (mask,)] = values` (or +=) with a static shape: a where over
    the mask, values picked by each True position's rank among the True positions."""
    k = mask.ndim
    full_mask = mask.reshape((1,) * pos + mask.shape + (1,) * (self.ndim - pos - k))
    # values broadcast against the indexed shape: self.shape[:pos] + (count,) + rest
    rest = self.ndim - pos - k
    lead = values.ndim - rest - 1  # which values dim (if any) runs over the True entries
    if lead >= 0 and values.shape[lead] != 1:
        # one value per True entry: the k-th True position (row-major) takes entry k
        rank = jnp.cumsum(mask.reshape(-1)) - 1
        picked = jnp.take(values, jnp.clip(rank, 0, values.shape[lead] - 1), axis=lead)
        picked = picked.reshape(values.shape[:lead] + mask.shape + values.shape[lead + 1:])
    else:
        # the same values for every True entry: their (size-1 or absent) count dim becomes
        # size-1 dims over the mask's dims
        before, after = (values.shape[:lead], values.shape[lead + 1:]) if lead >= 0 else ((), values.shape)
        picked = values.reshape(before + (1,) * k + after)
    picked = jnp.broadcast_to(picked, self.shape).astype(self.dtype)
    if accumulate:
        acc = _accumulate_dtype(self.dtype)
        return jnp.where(full_mask, self.astype(acc) + picked.astype(acc), self.astype(acc)).astype(self.dtype)
    return jnp.where(full_mask, picked, self)


def _pinned_count(indices):
    """The number of True entries when the integer indices pin it (a mask's nonzero
    positions broadcast against them as the last dim), else None."""
    shapes = [i.shape for i in indices if i is not None and not _is_mask(i)]
    lead = jnp.broadcast_shapes(*shapes) if shapes else ()
    return lead[-1] if lead and lead[-1] != 1 else None


def _padded_mask_indices(self, indices, values):
    """Masks -> fixed-length integer indices. When the count of True entries is not
    pinned by the other indices: the True positions first, then an out-of-range filler
    that `mode="drop"` discards, and values whose dim runs over the True entries are
    padded to the same length."""
    pinned = _pinned_count(indices)
    out = []
    padded = False
    dim = 0
    for i in indices:
        if _is_mask(i):
            n = pinned if pinned is not None else int(np.prod(i.shape))
            coords = jnp.nonzero(i, size=n, fill_value=0)
            if pinned is None:
                padded = True
                valid = jnp.arange(n) < jnp.count_nonzero(i)
                coords = [jnp.where(valid, c, self.shape[dim + d]) for d, c in enumerate(coords)]
            out.extend(coords)
            dim += i.ndim
        else:
            out.append(i)
            dim += 1
    if padded:
        target = jax.eval_shape(lambda x, idx: x[_indexer(idx)], self, out).shape
        right = target[len(target) - values.ndim:]
        widths = [(0, t - v) if v not in (1, t) else (0, 0) for v, t in zip(values.shape, right)]
        if any(w for _, w in widths):
            values = jnp.pad(values, widths)
    return out, values


@lowering(aten.index_put.default, aten._unsafe_index_put.default)
@index_bounds(bounds.advanced)
def _index_put(self, indices, values, accumulate=False):
    if values.size == 0:  # values broadcast to the indexed shape: nothing is selected
        return self
    values = values.astype(self.dtype)
    mask, pos = _only_leading_mask(self, indices)
    if mask is not None:
        return _masked_put(self, mask, pos, values, accumulate)
    indices, values = _padded_mask_indices(self, indices, values)
    where = _indexer(indices)
    if accumulate:
        acc = _accumulate_dtype(self.dtype)
        return self.astype(acc).at[where].add(values.astype(acc), mode="drop").astype(self.dtype)
    return self.at[where].set(values, mode="drop")


@lowering(aten._index_put_impl.default)
@index_bounds(bounds.advanced)
def _index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return _index_put(self, indices, values, accumulate)


# ---------------------------------------------------------------- gather / scatter
def _scatter_coords(index, dim):
    """Full coordinates of each `index` element for a dim-wise scatter: the index itself
    along `dim`, the element's own position along every other dim."""
    return tuple(index if d == dim else jnp.broadcast_to(
        jnp.arange(index.shape[d]).reshape([-1 if e == d else 1 for e in range(index.ndim)]), index.shape)
        for d in range(index.ndim))


def _leading_block(x, shape):
    """x[:shape[0], :shape[1], ...]: torch only reads the index-shaped corner of src."""
    return x[tuple(slice(0, s) for s in shape)]


@lowering(aten.gather.default)
@index_bounds(bounds.along_dim())
def _gather(self, dim, index, sparse_grad=False):
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    if index.size == 0:  # torch skips its shape checks for an empty index
        return jnp.zeros(index.shape, self.dtype)
    dim = _dim(dim, self.ndim)
    # index may be smaller than self in the other dims: torch reads self's leading corner
    shape = tuple(s if d == dim else index.shape[d] for d, s in enumerate(self.shape))
    return jnp.take_along_axis(_leading_block(self, shape), index, axis=dim, mode="clip")


_IDENTITY = {
    "sum": lambda dt: 0, "mean": lambda dt: 0, "prod": lambda dt: 1,
    "amax": lambda dt: -jnp.inf if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).min,
    "amin": lambda dt: jnp.inf if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).max,
}


def _reduce_into(self, where, src, reduce, include_self=True):
    """self.at[where] combined with src by `reduce` (sum, prod, mean, amax, amin), as
    torch's scatter_reduce/index_reduce do it: include_self=False drops self's values at
    the positions that receive something; mean divides by the count of contributions."""
    dtype = self.dtype
    acc = _accumulate_dtype(dtype)
    x, src = self.astype(acc), src.astype(acc)
    if not include_self:
        hit = jnp.zeros(self.shape, jnp.bool_).at[where].set(True)
        x = jnp.where(hit, jnp.asarray(_IDENTITY[reduce](acc), acc), x)
    ref = x.at[where]
    if reduce in ("sum", "mean"):
        out = ref.add(src)
    elif reduce == "prod":
        out = ref.multiply(src)
    elif reduce == "amax":
        out = ref.max(src)
    elif reduce == "amin":
        out = ref.min(src)
    else:
        raise RuntimeError(f"reduce argument must be sum, prod, mean, amax or amin, got {reduce}")
    if reduce == "mean":
        count = jnp.full(self.shape, 1 if include_self else 0, jnp.int64)
        count = count.at[where].add(1)
        count = jnp.where(count == 0, 1, count)
        out = out // count if jnp.issubdtype(acc, jnp.integer) else out / count
    return out.astype(dtype)


def _scatter(self, dim, index, src, reduce):
    """scatter's src is a tensor, or a scalar value for every index position."""
    src = jnp.asarray(src)
    if index.size == 0:  # nothing to write; torch skips its shape checks then
        return self
    if self.ndim == 0:  # torch allows 0-dim self and index: one element at position 0
        return _scatter(self.reshape(1), 0, index.reshape(1), src.reshape(-1)[:1], reduce).reshape(())
    dim = _dim(dim, self.ndim)
    where = _scatter_coords(index, dim)
    if src.ndim:
        src = _leading_block(src, index.shape)
    src = jnp.broadcast_to(src, index.shape)
    if reduce is None:
        return self.at[where].set(src.astype(self.dtype))
    return _reduce_into(self, where, src, reduce)


# scatter's legacy `reduce=` strings name the same reductions differently
_LEGACY_REDUCE = {"add": "sum", "multiply": "prod"}


@lowering(aten.scatter.src, aten.scatter.value)
@index_bounds(bounds.along_dim())
def _scatter_set(self, dim, index, src):
    return _scatter(self, dim, index, src, None)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
@index_bounds(bounds.along_dim())
def _scatter_legacy_reduce(self, dim, index, src, *, reduce):
    return _scatter(self, dim, index, src, _LEGACY_REDUCE[reduce])


@lowering(aten.scatter_add.default)
@index_bounds(bounds.along_dim())
def _scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "sum")


@lowering(aten.scatter_reduce.two)
@index_bounds(bounds.along_dim())
def _scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if index.size == 0:
        return self
    if self.ndim == 0:
        return _scatter_reduce(self.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                               include_self=include_self).reshape(())
    dim = _dim(dim, self.ndim)
    return _reduce_into(self, _scatter_coords(index, dim), _leading_block(src, index.shape),
                        reduce, include_self)


# ---------------------------------------------------------------- index_* along one dim
def _along(ndim, dim, index):
    """The .at[] indexer for `index` along `dim` (0-dim self counts as 1-D)."""
    dim = _dim(dim, max(ndim, 1))
    return (slice(None),) * dim + (index.reshape(-1),)


def _as_1d(x):
    return x.reshape(1) if x.ndim == 0 else x


@lowering(aten.index_select.default)
@index_bounds(bounds.along_dim())
def _index_select(self, dim, index):
    return jnp.take(_as_1d(self), index.reshape(-1), axis=_dim(dim, max(self.ndim, 1)), mode="clip")


@lowering(aten.index_add.default)
@index_bounds(bounds.along_dim())
def _index_add(self, dim, index, source, *, alpha=1):
    acc = _accumulate_dtype(self.dtype)
    src = _as_1d(source).astype(acc)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        src = src * alpha
    out = _as_1d(self).astype(acc).at[_along(self.ndim, dim, index)].add(src)
    return out.astype(self.dtype).reshape(self.shape)


@lowering(aten.index_copy.default)
@index_bounds(bounds.along_dim())
def _index_copy(self, dim, index, source):
    out = _as_1d(self).at[_along(self.ndim, dim, index)].set(_as_1d(source).astype(self.dtype))
    return out.reshape(self.shape)


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@index_bounds(bounds.along_dim(negative_ok=True))
def _index_fill(self, dim, index, value):
    out = _as_1d(self).at[_along(self.ndim, dim, index)].set(jnp.asarray(value).astype(self.dtype))
    return out.reshape(self.shape)


@lowering(aten.index_reduce.default)
@index_bounds(bounds.along_dim())
def _index_reduce(self, dim, index, source, reduce, *, include_self=True):
    out = _reduce_into(_as_1d(self), _along(self.ndim, dim, index), _as_1d(source), reduce,
                       include_self)
    return out.reshape(self.shape)


# ---------------------------------------------------------------- flat take / put, masks
def _flat_index(index, n):
    return jnp.where(index < 0, index + n, index)  # torch's take/put wrap negative indices


@lowering(aten.take.default)
@index_bounds(bounds.flat)
def _take(self, index):
    flat = self.reshape(-1)
    return jnp.take(flat, _flat_index(index, flat.shape[0]), mode="clip")


@lowering(aten.put.default)
@index_bounds(bounds.flat)
def _put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    where = _flat_index(index.reshape(-1), flat.shape[0])
    src = source.reshape(-1)
    if accumulate:
        acc = _accumulate_dtype(self.dtype)
        flat = flat.astype(acc).at[where].add(src.astype(acc))
    else:
        flat = flat.at[where].set(src.astype(self.dtype))
    return flat.astype(self.dtype).reshape(self.shape)


@lowering(aten.masked_scatter.default)
def _masked_scatter(self, mask, source):
    if mask.dtype != jnp.bool_:  # (a uint8 mask: torch refuses it, in CPU's words)
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with "
                           f"dtype {scalar_type_name(mask.dtype)}")
    shape = jnp.broadcast_shapes(self.shape, mask.shape)  # the result broadcasts both
    self = jnp.broadcast_to(self, shape)
    mask = jnp.broadcast_to(mask.astype(jnp.bool_), shape)
    flat_mask = mask.reshape(-1)
    # the k-th True position takes source's k-th element (row-major order)
    rank = jnp.clip(jnp.cumsum(flat_mask) - 1, 0, max(source.size - 1, 0))
    picked = source.reshape(-1)[rank].reshape(self.shape) if source.size else jnp.zeros_like(self)
    return jnp.where(mask, picked.astype(self.dtype), self)


# ---------------------------------------------------------------- sorted search
def _index_dtype(out_int32):
    return jnp.int32 if out_int32 else jnp.int64


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None,
                  sorter=None):
    side = side or ("right" if right else "left")
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    values = jnp.asarray(self)
    if seq.ndim == 1:
        out = jnp.searchsorted(seq, values, side=side)
    else:
        # one sorted row per leading index, searched for that row's own values (sizes
        # spelled out: -1 is ambiguous when a dim is 0)
        lead = math.prod(seq.shape[:-1])
        rows = seq.reshape(lead, seq.shape[-1])
        vals = values.reshape(lead, values.shape[-1])
        out = jax.vmap(lambda r, v: jnp.searchsorted(r, v, side=side))(rows, vals)
        out = out.reshape(values.shape)
    return out.astype(_index_dtype(out_int32))


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(self, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:  # (torch.compile: the fake kernel lets this through on tpu)
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    # right=False: b[i-1] < v <= b[i], which is searchsorted's side="left"
    out = jnp.searchsorted(boundaries, jnp.asarray(self), side="right" if right else "left")
    return out.astype(_index_dtype(out_int32))


# ---------------------------------------------------------------- data-dependent shapes
@lowering(aten.nonzero.default)
def _nonzero(self):
    if self.ndim == 0:
        return jnp.zeros((int(jnp.count_nonzero(self)), 0), jnp.int64)
    return jnp.stack(jnp.nonzero(self), axis=-1).astype(jnp.int64)


@lowering(aten.nonzero_static.default)
def _nonzero_static(self, *, size, fill_value=-1):
    # static shape: the first `size` True positions, then rows of fill_value
    if self.size == 0:  # jnp.nonzero pads an empty input with zeros, not fill_value
        return jnp.full((size, self.ndim), fill_value, jnp.int64)
    flat = self.reshape(-1) if self.ndim == 0 else self
    coords = jnp.nonzero(flat, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=-1).astype(jnp.int64)[:, :self.ndim]


@lowering(aten.masked_select.default)
def _masked_select(self, mask):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    return jnp.broadcast_to(self, shape).reshape(-1)[jnp.nonzero(mask)[0]]


@lowering(aten.repeat_interleave.Tensor)
def _repeat_interleave(repeats, *, output_size=None):
    # with output_size the shape is static and the op jits; without, repeats must be concrete
    return jnp.repeat(jnp.arange(repeats.shape[0]), repeats, total_repeat_length=output_size)


def _unique_flat(x, return_inverse, return_counts):
    values, inverse, counts = jnp.unique(x.reshape(-1), return_inverse=True, return_counts=True)
    inverse = inverse.reshape(x.shape) if return_inverse else jnp.zeros((0,), jnp.int64)
    counts = counts if return_counts else jnp.zeros((0,), jnp.int64)
    return values, inverse.astype(jnp.int64), counts.astype(jnp.int64)


@lowering(aten._unique2.default)
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # torch returns sorted values on every backend whatever `sorted` says; so do we
    return _unique_flat(self, return_inverse, return_counts)


@lowering(aten._unique.default)
def _unique(self, sorted=True, return_inverse=False):
    values, inverse, _ = _unique_flat(self, return_inverse, False)
    return values, inverse


@lowering(aten.unique_dim.default)
def _unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    # torch's dim variants return inverse and counts whatever the flags say
    values, inverse, counts = jnp.unique(self, axis=_dim(dim, self.ndim), return_inverse=True,
                                         return_counts=True)
    return values, inverse.reshape(-1).astype(jnp.int64), counts.astype(jnp.int64)


@lowering(aten.unique_consecutive.default)
def _unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        x = self.reshape(-1, 1)
        axis = 0
    else:
        axis = _dim(dim, self.ndim)
        # (an explicit width: reshape cannot infer -1 when the tensor is empty)
        x = jnp.moveaxis(self, axis, 0).reshape(self.shape[axis], math.prod(
            d for i, d in enumerate(self.shape) if i != axis))
    n = x.shape[0]
    # a run starts where a slice differs from the one before it
    starts = jnp.concatenate([jnp.ones((min(n, 1),), jnp.bool_), jnp.any(x[1:] != x[:-1], axis=1)])
    first = jnp.nonzero(starts)[0]
    if dim is None:
        values = self.reshape(-1)[first]
    else:
        values = jnp.take(self, first, axis=axis)
    inverse = (jnp.cumsum(starts) - 1).astype(jnp.int64)
    counts = jnp.diff(jnp.append(first, n)).astype(jnp.int64)
    if dim is not None:  # like unique_dim: inverse and counts whatever the flags say
        return values, inverse, counts
    empty = jnp.zeros((0,), jnp.int64)
    return (values, inverse.reshape(self.shape) if return_inverse else empty,
            counts if return_counts else empty)


# ---------------------------------------------------------------- membership
@lowering(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def _isin(elements, test_elements, *, assume_unique=False, invert=False):
    # one broadcast comparison: HF generation calls this with a handful of stop tokens
    test = jnp.ravel(jnp.asarray(test_elements))
    found = jnp.any(jnp.asarray(elements)[..., None] == test, axis=-1)
    return jnp.logical_not(found) if invert else found


# ---------------------------------------------------------------- asserts
def _assertion(vals):
    """`_assert_async(t[, msg])` as a device-side assert: t must be nonzero (a one-element
    tensor, as torch asks). The bound reads 1 where it is zero, outside [0, 1)."""
    msg = vals[1] if len(vals) > 1 else "Expected Tensor with single nonzero value, but got zero"
    return [bounds.Bound("self", (vals[0] == 0) * 1, 1, f'the assertion "{msg}"',
                         noun="a false (zero) value")]


@lowering(aten._assert_async.default, aten._assert_async.msg)
@index_bounds(_assertion)
def _assert_async(self, assert_msg=None):
    # the check is the declared bound, reported at the next synchronization (CUDA's
    # asynchronous assert); the op has no result. torch.compile's backend does not check.
    return ()
