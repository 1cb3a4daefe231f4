"""Shape ops that compute new values: cat, padding, flip/roll, tril/triu, repeat, the
functional `*_copy` twins of the view ops, and the `*_scatter` ops that write into a view.

The view ops themselves (view, slice, select, transpose, ...) never come here: their C++
kernels share storage. The `*_copy` and `*_scatter` ops reach us from functionalized
graphs (torch.compile) and from torch's composite kernels; their lowerings read the
input's logical value, which is what those ops mean for every non-`as_strided` view.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import _runtime
from .registry import aten, lowering


def _promoted_dtype(xs):
    """torch's result dtype for a list of dimensioned tensors (cat, stack)."""
    dt = _runtime.torch_dtype(xs[0].dtype)
    for x in xs[1:]:
        dt = torch.promote_types(dt, _runtime.torch_dtype(x.dtype))
    return _runtime.jax_dtype(dt)


def _dim(d, ndim):
    return d + ndim if d < 0 else d


# ---------------------------------------------------------------- cat
@lowering(aten.cat.default)
def _cat(tensors, dim=0):
    dtype = _promoted_dtype(tensors)
    # torch's legacy rule: 1-D empty tensors are skipped, whatever the other shapes
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=_dim(dim, kept[0].ndim))


@lowering(aten.stack.default)
def _stack(tensors, dim=0):
    # eager tpu runs torch's composite kernel (cat of unsqueezes); a compiled graph holds
    # the op whole (SAM3's tracker's backward: without it the graph ran op by op)
    dtype = _promoted_dtype(tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=_dim(dim, tensors[0].ndim + 1))


# ---------------------------------------------------------------- padding
def _pad_config(ndim, pad):
    """torch's pad list (last dim first, (before, after) pairs) -> per-dim pairs."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


@lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(self, pad, value=0):
    # lax.pad takes negative widths too, which crop like torch's negative padding
    config = [(lo, hi, 0) for lo, hi in _pad_config(self.ndim, pad)]
    return lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


def _reflect_index(k, n):
    k = np.abs(k)  # reflection excludes the edge: -1 -> 1, n -> n - 2
    return np.where(k >= n, 2 * (n - 1) - k, k)


def _replicate_index(k, n):
    return np.clip(k, 0, n - 1)


def _mode_pad(source_index):
    """A pad that reads, for output position j of each padded dim, input position
    source_index(j - before, n): torch's formula, negative widths (crops) included."""

    def pad(self, padding):
        for d, (lo, hi) in enumerate(_pad_config(self.ndim, padding)):
            if lo or hi:
                n = self.shape[d]
                index = source_index(np.arange(n + lo + hi) - lo, n)
                self = jnp.take(self, index, axis=d)
        return self

    return pad


def _mode_pad_backward(forward):
    # the transpose of a gather-style pad: let JAX differentiate the forward
    def backward(grad_output, self, padding):
        _, vjp = jax.vjp(lambda x: forward(x, padding), self.astype(grad_output.dtype))
        return vjp(grad_output)[0]

    return backward


_reflect = _mode_pad(_reflect_index)
_replicate = _mode_pad(_replicate_index)
lowering(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
         aten.reflection_pad3d.default)(_reflect)
lowering(aten.replication_pad1d.default, aten.replication_pad2d.default,
         aten.replication_pad3d.default)(_replicate)
lowering(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
         aten.reflection_pad3d_backward.default)(_mode_pad_backward(_reflect))
lowering(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
         aten.replication_pad3d_backward.default)(_mode_pad_backward(_replicate))


# ---------------------------------------------------------------- reorder / mask / tile
@lowering(aten.flip.default)
def _flip(self, dims):
    return jnp.flip(self, axis=tuple(dims)) if dims else self


@lowering(aten.roll.default)
def _roll(self, shifts, dims=()):
    if not dims:  # torch rolls the flattened tensor
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), axis=tuple(dims))


@lowering(aten.tril.default)
def _tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowering(aten.triu.default)
def _triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lowering(aten.repeat.default)
def _repeat(self, repeats):
    # jnp.tile prepends size-1 dims when there are more repeats than dims, as torch does
    return jnp.tile(self, tuple(repeats))


@functools.lru_cache(maxsize=256)
def _tri_indices(row, col, offset, lower):
    if lower:
        r, c = np.tril_indices(row, offset, col)
    else:
        r, c = np.triu_indices(row, offset, col)
    return np.stack([r, c]).astype(np.int64)


@lowering(aten.tril_indices.default)
def _tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    # all arguments are static ints: the indices are a constant of the program
    return jnp.asarray(_tri_indices(row, col, offset, True))


@lowering(aten.triu_indices.default)
def _triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(_tri_indices(row, col, offset, False))


# ---------------------------------------------------------------- functional view copies
def _slicer(ndim, dim, item):
    return (slice(None),) * dim + (item,) + (slice(None),) * (ndim - dim - 1)


def _slice(ndim, dim, start, end, step):
    # Python slice semantics clamp and wrap exactly like torch's slice
    return _slicer(ndim, _dim(dim, ndim), slice(start, end, step))


def _select(ndim, dim, index):
    return _slicer(ndim, _dim(dim, ndim), index)


@lowering(aten.alias_copy.default)
def _alias_copy(self):
    return self


@lowering(aten.expand_copy.default)
def _expand_copy(self, size, *, implicit=False):
    lead = len(size) - self.ndim
    shape = [self.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(self, shape)


@lowering(aten.t_copy.default)
def _t_copy(self):
    return self.T


@lowering(aten.transpose_copy.int)
def _transpose_copy(self, dim0, dim1):
    return jnp.swapaxes(self, dim0, dim1) if self.ndim else self


@lowering(aten.permute_copy.default)
def _permute_copy(self, dims):
    return jnp.transpose(self, [_dim(d, self.ndim) for d in dims])


@lowering(aten.view_copy.default, aten._reshape_copy.default)
def _view_copy(self, size):
    return jnp.reshape(self, size)


# complex views (eager: C++ view kernels over one storage; a compiled graph's functional
# twins, e.g. a complex rotary embedding: view_as_complex, multiply, view_as_real)
@lowering(aten.view_as_complex_copy.default)
def _view_as_complex_copy(self):
    return lax.complex(self[..., 0], self[..., 1])


@lowering(aten.view_as_real_copy.default)
def _view_as_real_copy(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowering(aten._conj_copy.default)
def _conj_copy(self):
    return jnp.conj(self)


@lowering(aten.slice_copy.Tensor)
def _slice_copy(self, dim=0, start=None, end=None, step=1):
    return self[_slice(self.ndim, dim, start, end, step)]


@lowering(aten.narrow_copy.default)
def _narrow_copy(self, dim, start, length):
    dim = _dim(dim, self.ndim)
    start = start + self.shape[dim] if start < 0 else start  # the meta kernel checked range
    return lax.slice_in_dim(self, start, start + length, axis=dim)


@lowering(aten.select_copy.int)
def _select_copy(self, dim, index):
    return self[_select(self.ndim, dim, index)]


@lowering(aten.unsqueeze_copy.default)
def _unsqueeze_copy(self, dim):
    return jnp.expand_dims(self, _dim(dim, self.ndim + 1))


@lowering(aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def _squeeze_copy(self, dim=None):
    if dim is None:
        dims = range(self.ndim)
    else:
        dims = [dim] if isinstance(dim, int) else dim
    # torch leaves a named dim alone when its size is not 1
    axes = tuple(d for d in (_dim(d, self.ndim) for d in dims) if self.ndim and self.shape[d] == 1)
    return jnp.squeeze(self, axes) if axes else self


@lowering(aten.split_with_sizes_copy.default)
def _split_with_sizes_copy(self, split_sizes, dim=0):
    dim = _dim(dim, self.ndim)
    offsets = np.cumsum([0] + list(split_sizes))
    return [lax.slice_in_dim(self, int(a), int(b), axis=dim) for a, b in zip(offsets[:-1], offsets[1:])]


@lowering(aten.unbind_copy.int)
def _unbind_copy(self, dim=0):
    dim = _dim(dim, self.ndim)
    return [lax.index_in_dim(self, i, axis=dim, keepdims=False) for i in range(self.shape[dim])]


@lowering(aten.diagonal_copy.default)
def _diagonal_copy(self, offset=0, dim1=0, dim2=1):
    # jnp.diagonal appends the diagonal as the last dim, like torch
    return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


def _unfold(self, dimension, size, step):
    """Tensor.unfold's value: windows of `size` every `step` along `dimension`, the windows
    in place of that dim and each window's elements as a new last dim."""
    if self.ndim == 0:
        return jnp.broadcast_to(self, (size,))
    dim = _dim(dimension, self.ndim)
    count = (self.shape[dim] - size) // step + 1
    index = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    return jnp.moveaxis(jnp.take(self, index, axis=dim), dim + 1, -1)


lowering(aten.unfold_copy.default)(_unfold)


@lowering(aten.unfold_backward.default)
def _unfold_backward(grad_in, input_sizes, dim, size, step):
    # overlapping windows sum their gradients: the transpose of the gather above
    # (grad_in may broadcast to the windows' shape: istft's compiled backward hands one
    # window row for all, as torch's kernel accepts)
    out, vjp = jax.vjp(lambda x: _unfold(x, dim, size, step), jnp.zeros(input_sizes, grad_in.dtype))
    return vjp(jnp.broadcast_to(grad_in, out.shape))[0]


# ---------------------------------------------------------------- *_scatter: write into a view
@lowering(aten.slice_scatter.default)
def _slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    return self.at[_slice(self.ndim, dim, start, end, step)].set(src.astype(self.dtype))


@lowering(aten.select_scatter.default)
def _select_scatter(self, src, dim, index):
    return self.at[_select(self.ndim, dim, index)].set(src.astype(self.dtype))


def _diagonal_coords(shape, offset, dim1, dim2):
    n = max(0, min(shape[dim1] + min(offset, 0), shape[dim2] - max(offset, 0)))
    i = np.arange(n)
    return i - min(offset, 0), i + max(offset, 0)


@lowering(aten.diagonal_scatter.default)
def _diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    rows, cols = _diagonal_coords(self.shape, offset, dim1, dim2)
    # with dim1, dim2 moved last, `[..., rows, cols]` addresses the diagonal as the last dim,
    # which is where torch.diagonal puts it (and so where src has it)
    moved = jnp.moveaxis(self, (dim1, dim2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))
