"""Sorting and the order statistics built on it: sort, argsort, topk, kthvalue, median,
nanmedian, mode.

Ordering follows torch's sort: NaN is larger than every number (whatever its sign bit),
-0.0 equals 0.0, and equal elements keep their original order. `lax.sort` already
canonicalizes NaN and zero in its comparator, so ascending order needs no key tricks.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .reduction import _axis, _is_float, _squeeze_unless
from .registry import aten, lowering


def _sort(x, axis, descending):
    """Stable sort along `axis` -> (values, int64 original indices). Descending order
    sorts the reversed tensor ascending and reverses the result: equal elements then
    still come in their original order and NaN comes first, as torch's stable sort does."""
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    if descending:
        x, idx = jnp.flip(x, axis), jnp.flip(idx, axis)
    values, idx = lax.sort((x, idx), dimension=axis, is_stable=True, num_keys=1)
    if descending:
        values, idx = jnp.flip(values, axis), jnp.flip(idx, axis)
    return values, idx


@lowering(aten.sort.default, aten.sort.stable)
def _sort_op(self, dim=-1, descending=False, *, stable=None):
    # every sort here is stable, which also satisfies stable=False
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    return _sort(self, _axis(self, dim), descending)


@lowering(aten.topk.default)
def _topk(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = _axis(self, dim)
    values, idx = _sort(self, axis, descending=largest)
    take = lambda a: lax.slice_in_dim(a, 0, k, axis=axis)  # noqa: E731
    return take(values), take(idx)


def _select_sorted(values, idx, pos, axis, keepdim):
    """The element at (traced) sorted position `pos` along `axis`, `pos` keeping that axis."""
    v = jnp.take_along_axis(values, pos, axis=axis)
    i = jnp.take_along_axis(idx, pos, axis=axis)
    return _squeeze_unless(v, axis, keepdim), _squeeze_unless(i, axis, keepdim)


@lowering(aten.kthvalue.default)
def _kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = _axis(self, dim)
    values, idx = _sort(self, axis, False)
    pos = jnp.full(values.shape[:axis] + (1,) + values.shape[axis + 1:], k - 1, jnp.int64)
    return _select_sorted(values, idx, pos, axis, keepdim)


def _median(x, axis, keepdim, ignore_nan):
    """torch's median is the lower of the two middle values. With NaN present, median
    returns a NaN; nanmedian takes the median of the numbers (NaN if there are none).
    Sorted ascending, the NaNs sit at the end, so both are a position in the sort."""
    values, idx = _sort(x, axis, False)
    n = x.shape[axis]
    if _is_float(x):
        nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True, dtype=jnp.int64)
    else:
        nans = jnp.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1:], jnp.int64)
    if ignore_nan:
        pos = jnp.maximum((n - nans - 1) // 2, 0)
    else:
        pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    return _select_sorted(values, idx, pos, axis, keepdim)


def _median_of_nothing(x):
    """torch's median of an empty tensor: NaN, which its integer kernels turn into the
    dtype's minimum (the sort would instead pick a value past the end)."""
    if _is_float(x):
        return jnp.full((), jnp.nan, x.dtype)
    return jnp.full((), jnp.iinfo(x.dtype).min if x.dtype != jnp.bool_ else False, x.dtype)


@lowering(aten.median.default)
def _median_all(self):
    if self.size == 0:
        return _median_of_nothing(self)
    return _median(self.reshape(-1), 0, False, ignore_nan=False)[0]


@lowering(aten.nanmedian.default)
def _nanmedian_all(self):
    if self.size == 0:
        return _median_of_nothing(self)
    return _median(self.reshape(-1), 0, False, ignore_nan=True)[0]


@lowering(aten.median.dim)
def _median_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    return _median(self, _axis(self, dim), keepdim, ignore_nan=False)


@lowering(aten.nanmedian.dim)
def _nanmedian_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    return _median(self, _axis(self, dim), keepdim, ignore_nan=True)


@lowering(aten.mode.default)
def _mode(self, dim=-1, keepdim=False):
    """Most frequent value; among equally frequent values the smallest, and its last
    index, like torch's CPU kernel. Runs of equal values in the stable sort give each
    position its count so far; the first position holding the maximal count is the last
    element of the smallest most-frequent value."""
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = _axis(self, dim)
    values, idx = _sort(self, axis, False)
    pos = lax.broadcasted_iota(jnp.int64, values.shape, axis)
    n = values.shape[axis]
    same_as_prev = jnp.concatenate(
        [jnp.zeros_like(lax.slice_in_dim(values, 0, 1, axis=axis), jnp.bool_),
         lax.slice_in_dim(values, 1, n, axis=axis) == lax.slice_in_dim(values, 0, n - 1, axis=axis)],
        axis=axis)
    run_start = lax.cummax(jnp.where(same_as_prev, 0, pos), axis=axis)
    best = jnp.argmax(pos - run_start, axis=axis, keepdims=True)
    return _select_sorted(values, idx, best, axis, keepdim)
