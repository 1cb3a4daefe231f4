"""Convolution and pooling (max, fractional max, average, adaptive), channel shuffle and
im2col/col2im, forward and backward, for 1, 2 and 3 spatial dims (upsampling and grid
sampling are in resample.py).

Layouts are torch's (N, C, *spatial) inputs and (O, I/groups, *kernel) weights, which are
lax.conv_general_dilated's defaults. Backward ops that are linear in their input
(convolution, average pooling) are the JAX vjp of the forward lowering, so forward and
backward can never disagree; max pooling (fractional too) scatters through its indices, as
torch's kernels do.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _precision as precision
from . import bounds
from ._dtypes import round_to, to_opmath
from .registry import aten, index_bounds, lowering


def _exact(dtype):
    # resampling and pooling weights applied as small products: torch's kernels compute
    # them in full float32 whatever the matmul precision, and so do these (XLA's DEFAULT
    # precision would let a TPU use a single bf16 pass)
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _expand(v, n):
    """torch lets an int[2] / int[3] argument be one value for every spatial dim."""
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _contract_trailing(x, mats):
    """Apply one (out, size) matrix along each trailing spatial dim."""
    nd = len(mats)
    for axis, m in enumerate(mats):
        dim = x.ndim - nd + axis
        y = jnp.tensordot(x, jnp.asarray(m, x.dtype), axes=([dim], [1]),
                          precision=_exact(x.dtype))
        x = jnp.moveaxis(y, -1, dim)
    return x


def _transpose_of(forward, grad_output, input_size):
    """The backward of a linear op (resampling, im2col): its vjp, evaluated at any input."""
    g = to_opmath(grad_output)
    _, vjp = jax.vjp(forward, jnp.zeros(tuple(input_size), g.dtype))
    return vjp(g)[0]


# ---------------------------------------------------------------- convolution
def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.ndim - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    dtype = jnp.result_type(x, w)
    x, w = x.astype(dtype), w.astype(dtype)
    # reduced-precision inputs accumulate in float32, as torch's kernels do
    acc = jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else None
    if not transposed:
        return lax.conv_general_dilated(
            x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation,
            feature_group_count=groups, precision=precision.for_conv(dtype), preferred_element_type=acc)
    # A transposed convolution is the input gradient of the forward one: dilate the input by
    # the stride and convolve with the flipped kernel, whose (in, out/groups) axes torch
    # stores swapped relative to a forward weight.
    output_padding = _expand(output_padding, nd)
    kernel = w.shape[2:]
    c_in, c_out_g = w.shape[:2]
    w = w.reshape((groups, c_in // groups, c_out_g) + kernel).swapaxes(1, 2)
    w = w.reshape((groups * c_out_g, c_in // groups) + kernel)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(kernel, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x, w, (1,) * nd, pads, lhs_dilation=stride, rhs_dilation=dilation,
        feature_group_count=groups, precision=precision.for_conv(dtype), preferred_element_type=acc)


@lowering(aten.convolution.default)
@precision.sensitive
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    # torch checks this in at::_convolution, below the op lowered here, and its meta kernel
    # does not; lax.conv_general_dilated would crop
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + to_opmath(bias).reshape((-1,) + (1,) * (out.ndim - 2))
    return out


@lowering(aten.convolution_backward.default)
@precision.sensitive
def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    def conv(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        out, vjp = jax.vjp(conv, input, weight)
        grad_input, grad_weight = vjp(grad_output.astype(out.dtype))
    overlap = math.prod(weight.shape[2:]) / math.prod(_expand(stride, input.ndim - 2))
    if output_mask[1] and not transposed and groups == 1 and overlap <= _PATCHES_MAX:
        grad_weight = _weight_grad_by_patches(
            grad_output.astype(grad_weight.dtype), input.astype(grad_weight.dtype),
            weight.shape, stride, padding, dilation).astype(grad_weight.dtype)
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(to_opmath(grad_output), axis=axes)
    return (grad_input if output_mask[0] else None,
            grad_weight if output_mask[1] else None,
            grad_bias)


# The weight gradient sums over every batch row and output position. XLA:CPU's transposed
# convolution (the vjp) sums a large kernel's long chains in order: a patch embedding
# (AST's 16x16 kernel at stride 10, 2x12x101 positions) came out 2.7x further from float64
# than CPU's kernel. As an explicit product of the input's patches with the gradient it
# is as accurate as CPU's (measured: RMSE 2.0e-8 against CPU's 1.6e-8 and the vjp's 4.4e-8;
# a 3x3 stride-1 conv: 4.1e-8 against 1.0e-7 for both). The patches take the input's
# memory times kernel / stride, so only kernels that overlap little use them.
_PATCHES_MAX = 4


def _weight_grad_by_patches(grad_output, input, weight_shape, stride, padding, dilation):
    nd = input.ndim - 2
    kernel = tuple(weight_shape[2:])
    patches = lax.conv_general_dilated_patches(  # (N, C * prod(kernel), *out): exact copies
        input, kernel, _expand(stride, nd), [(q, q) for q in _expand(padding, nd)],
        rhs_dilation=_expand(dilation, nd), precision=lax.Precision.HIGHEST)
    spatial = tuple(range(2, 2 + nd))
    acc = jnp.float32 if input.dtype in (jnp.bfloat16, jnp.float16) else None
    g = lax.dot_general(grad_output, patches, (((0,) + spatial, (0,) + spatial), ((), ())),
                        precision=precision.for_conv(input.dtype), preferred_element_type=acc)
    return g.reshape(weight_shape)


# ---------------------------------------------------------------- window geometry
def _pool_geometry(size, kernel, stride, padding, dilation, ceil_mode):
    """-> (output length, (low, high) padding giving at least that many windows)."""
    span = dilation * (kernel - 1) + 1
    room = size + 2 * padding - span
    out = (-(-room // stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1  # torch: the last window must start inside the input or its left padding
    high = (out - 1) * stride + span - size - padding
    return out, (padding, max(high, 0))


def _windows(operand, init, op, kernel, stride, dilation, pads, out):
    """reduce_window over the trailing spatial dims, cut to `out` windows per dim."""
    first = operand[0] if isinstance(operand, tuple) else operand
    lead = first.ndim - len(kernel)
    res = lax.reduce_window(
        operand, init, op, (1,) * lead + tuple(kernel), (1,) * lead + tuple(stride),
        ((0, 0),) * lead + tuple(pads), window_dilation=(1,) * lead + tuple(dilation))
    cut = (slice(None),) * lead + tuple(slice(0, o) for o in out)
    return tuple(r[cut] for r in res) if isinstance(res, tuple) else res[cut]


def _pool_args(nd, kernel, stride, padding, dilation=(1,)):
    kernel = _expand(kernel, nd)
    stride = _expand(stride, nd) if len(stride) else kernel  # torch: stride=[] means kernel
    return kernel, stride, _expand(padding, nd), _expand(dilation, nd)


# ---------------------------------------------------------------- max pooling
def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _max_with_index(a, b):
    """The reducer of (value, flat input index) pairs. torch keeps the first maximum and
    lets NaN win (the last NaN, as its scan replaces on isnan); a total order, so XLA may
    reduce in any order."""
    av, ai = a
    bv, bi = b
    take_b = (bv > av) | ((bv == av) & (bi < ai))
    if jnp.issubdtype(av.dtype, jnp.floating):
        a_nan, b_nan = jnp.isnan(av), jnp.isnan(bv)
        take_b = jnp.where(a_nan | b_nan, b_nan & (~a_nan | (bi > ai)), take_b)
    return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)


def _max_pool(x, nd, kernel, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _pool_args(nd, kernel, stride, padding, dilation)
    spatial = x.shape[-nd:]
    geo = [_pool_geometry(*a, ceil_mode) for a in zip(spatial, kernel, stride, padding, dilation)]
    out, pads = [g[0] for g in geo], [g[1] for g in geo]
    # the flat index of every element within its (d, h, w) plane, as torch's indices count
    index = jnp.broadcast_to(jnp.arange(math.prod(spatial)).reshape(spatial), x.shape)
    no_index = jnp.array(np.iinfo(np.int64).max, index.dtype)  # loses every tie
    return _windows((x, index), (_lowest(x.dtype), no_index), _max_with_index,
                    kernel, stride, dilation, pads, out)


def _scatter_by_index(grad_output, indices, input_shape, nd):
    """Add each output gradient into the input element its index names: the backward of
    every max pooling."""
    plane = math.prod(input_shape[-nd:])
    g = to_opmath(grad_output).reshape(-1, math.prod(grad_output.shape[-nd:]))
    idx = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    return jnp.zeros((g.shape[0], plane), g.dtype).at[rows, idx].add(g).reshape(input_shape)


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,),
                             ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowering(aten.max_pool3d_with_indices.default)
def _max_pool3d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,),
                             ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                      ceil_mode, indices):
    return _scatter_by_index(grad_output, indices, self.shape, 2)


@lowering(aten.max_pool3d_with_indices_backward.default)
def _max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                      ceil_mode, indices):
    return _scatter_by_index(grad_output, indices, self.shape, 3)


# ---------------------------------------------------------------- fractional max pooling
def _fractional_starts(sample, size, out, pool):
    """torch's generate_intervals: where each of the `out` windows starts, from a plane's
    sample u in [0, 1): int((i + u) * alpha) - int(u * alpha) with alpha = (size - pool) /
    (out - 1), the last window flush with the end. The arithmetic rounds to the sample's
    dtype after every step, as torch's scalar_t arithmetic does."""
    dtype = sample.dtype

    def rounded(v):
        return round_to(v, dtype)

    u = sample.astype(to_opmath(sample).dtype)[..., None]
    i = jnp.arange(out, dtype=u.dtype)
    alpha = rounded(jnp.asarray(size - pool, u.dtype) / max(out - 1, 1))
    starts = (jnp.trunc(rounded(rounded(i + u) * alpha))
              - jnp.trunc(rounded(u * alpha))).astype(jnp.int64)
    return jnp.where(i == out - 1, size - pool, starts)


def _fractional_max_pool(x, kernel, output_size, samples, sample_axes):
    """Max over pseudo-random windows: per plane, window starts from `samples` (N, C, nd),
    whose entry sample_axes[d] drives spatial dim d. Scans each window in row-major order
    keeping the first maximum, a NaN replacing it (torch's `val > max || isnan(val)`)."""
    nd = len(kernel)
    if x.ndim == nd + 1:  # unbatched (C, *spatial): samples are (1, C, nd)
        best, index = _fractional_max_pool(x[None], kernel, output_size, samples, sample_axes)
        return best[0], index[0]
    spatial = x.shape[-nd:]
    starts = [_fractional_starts(samples[..., a], size, out, k)
              for a, size, out, k in zip(sample_axes, spatial, output_size, kernel)]
    strides = [math.prod(spatial[d + 1:]) for d in range(nd)]
    # the flat in-plane index of each window's first element, (N, C, *output_size)
    base = 0
    for d, (st, stride) in enumerate(zip(starts, strides)):
        base = base + (st * stride).reshape(st.shape[:2] + tuple(
            st.shape[-1] if e == d else 1 for e in range(nd)))
    planes = x.reshape(x.shape[:2] + (math.prod(spatial),))  # sizes spelled out: N may be 0
    best = jnp.full(base.shape, -jnp.inf, x.dtype)
    best_index = base
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = base + sum(o * s for o, s in zip(offset, strides))
        flat = index.reshape(planes.shape[:2] + (math.prod(output_size),))
        val = jnp.take_along_axis(planes, flat, axis=2)
        val = val.reshape(base.shape)
        take = (val > best) | jnp.isnan(val)
        best, best_index = jnp.where(take, val, best), jnp.where(take, index, best_index)
    return best, best_index


@lowering(aten.fractional_max_pool2d.default)
def _fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    # a plane's samples are (w, h)
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, (1, 0))


@lowering(aten.fractional_max_pool3d.default)
def _fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    # a plane's samples are (t, h, w)
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, (0, 1, 2))


@lowering(aten.fractional_max_pool2d_backward.default)
def _fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_by_index(grad_output, indices, self.shape, 2)


@lowering(aten.fractional_max_pool3d_backward.default)
def _fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_by_index(grad_output, indices, self.shape, 3)


# ---------------------------------------------------------------- average pooling
def _avg_pool(x, nd, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, dilation = _pool_args(nd, kernel, stride, padding)
    x = to_opmath(x)
    spatial = x.shape[-nd:]
    geo = [_pool_geometry(*a, ceil_mode) for a in zip(spatial, kernel, stride, padding, dilation)]
    out, pads = [g[0] for g in geo], [g[1] for g in geo]
    zero = np.array(0, x.dtype)  # a concrete init lets JAX see a differentiable window sum
    sums = _windows(x, zero, lax.add, kernel, stride, dilation, pads, out)
    if divisor_override:
        return sums / divisor_override
    # torch divides by the window's overlap with the zero-padded input (count_include_pad)
    # or with the input alone; windows hanging past the padding (ceil_mode) count neither
    if count_include_pad:
        ones = jnp.ones(tuple(s + 2 * p for s, p in zip(spatial, padding)), x.dtype)
        count_pads = [(0, max(hi - p, 0)) for (_, hi), p in zip(pads, padding)]
    else:
        ones = jnp.ones(spatial, x.dtype)
        count_pads = pads
    counts = _windows(ones, zero, lax.add, kernel, stride, dilation, count_pads, out)
    return sums / counts


def _avg_pool_backward(grad_output, self, nd, *args):
    _, vjp = jax.vjp(lambda x: _avg_pool(x, nd, *args), to_opmath(self))
    return vjp(to_opmath(grad_output))[0]


@lowering(aten.avg_pool2d.default)
def _avg_pool2d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@lowering(aten.avg_pool3d.default)
def _avg_pool3d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                         count_include_pad, divisor_override):
    return _avg_pool_backward(grad_output, self, 2, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


@lowering(aten.avg_pool3d_backward.default)
def _avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                         count_include_pad, divisor_override):
    return _avg_pool_backward(grad_output, self, 3, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


# ---------------------------------------------------------------- adaptive pooling
def _adaptive_bins(size, out):
    """torch's adaptive windows: bin i covers [floor(i*size/out), ceil((i+1)*size/out))."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg(x, output_size):
    nd = len(output_size)
    x = to_opmath(x)
    members, counts = [], np.ones(())
    for size, out in zip(x.shape[-nd:], output_size):
        start, end = _adaptive_bins(size, out)
        pos = np.arange(size)
        members.append((pos >= start[:, None]) & (pos < end[:, None]))
        counts = np.multiply.outer(counts, end - start)
    # sum each bin with a 0/1 matrix per dim, then divide once, as torch does
    return _contract_trailing(x, members) / jnp.asarray(counts, x.dtype)


def _adaptive_avg_backward(grad_output, self, nd):
    _, vjp = jax.vjp(lambda x: _adaptive_avg(x, grad_output.shape[-nd:]), to_opmath(self))
    return vjp(to_opmath(grad_output))[0]


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg(self, _expand(output_size, 2))


@lowering(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, _expand(output_size, 3))


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 2)


@lowering(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 3)


def _adaptive_max(x, output_size):
    """Gather every bin padded to the widest bin, mask the padding, and take the max and
    its flat index within the input plane."""
    nd = len(output_size)
    lead = x.ndim - nd
    gather, valid, flat = [], np.bool_(True), 0
    for axis, (size, out) in enumerate(zip(x.shape[lead:], output_size)):
        start, end = _adaptive_bins(size, out)
        pos = start[:, None] + np.arange(int((end - start).max()))  # (out, width)
        shape = [1] * (2 * nd)
        shape[2 * axis:2 * axis + 2] = pos.shape
        inside = np.minimum(pos, size - 1).reshape(shape)
        gather.append(inside)
        valid = valid & (pos < end[:, None]).reshape(shape)
        flat = flat * size + inside
    # (..., o1, w1, o2, w2, ...) -> (..., o1, o2, ..., w1 * w2 * ...)
    order = [2 * i for i in range(nd)] + [2 * i + 1 for i in range(nd)]
    windows = tuple(output_size) + (-1,)
    valid = np.broadcast_to(valid, flat.shape).transpose(order).reshape(windows)
    flat = flat.transpose(order).reshape(windows)
    vals = x[(Ellipsis,) + tuple(gather)]
    vals = vals.transpose(tuple(range(lead)) + tuple(lead + o for o in order))
    vals = jnp.where(valid, vals.reshape(x.shape[:lead] + windows), _lowest(x.dtype))
    best = jnp.argmax(vals, axis=-1, keepdims=True)
    index = jnp.take_along_axis(jnp.broadcast_to(flat, vals.shape), best, axis=-1)
    return jnp.take_along_axis(vals, best, axis=-1)[..., 0], index[..., 0]


@lowering(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(self, output_size):
    return _adaptive_max(self, _expand(output_size, 2))


@lowering(aten.adaptive_max_pool3d.default)
def _adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, _expand(output_size, 3))


@lowering(aten.adaptive_max_pool2d_backward.default)
def _adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_by_index(grad_output, indices, self.shape, 2)


@lowering(aten.adaptive_max_pool3d_backward.default)
def _adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_by_index(grad_output, indices, self.shape, 3)


def _max_unpool(x, indices, output_size):
    """Write every value to the flat position its index names in a zero output plane."""
    nd = len(output_size)
    lead = x.shape[:x.ndim - nd]
    rows = math.prod(lead)
    out = jnp.zeros((rows, math.prod(output_size)), x.dtype)
    out = out.at[jnp.arange(rows)[:, None], indices.reshape(rows, -1)].set(x.reshape(rows, -1))
    return out.reshape(lead + tuple(output_size))


@lowering(aten.max_unpool2d.default)
@index_bounds(bounds.unpool)
def _max_unpool2d(self, indices, output_size):
    return _max_unpool(self, indices, output_size)


@lowering(aten.max_unpool3d.default)
@index_bounds(bounds.unpool)
def _max_unpool3d(self, indices, output_size, stride, padding):
    return _max_unpool(self, indices, output_size)


# ---------------------------------------------------------------- channel shuffle
@lowering(aten.channel_shuffle.default)
def _channel_shuffle(self, groups):
    # (N, g, C/g, *) -> (N, C/g, g, *): ShuffleNet's interleaving of the groups' channels
    n, c = self.shape[:2]
    x = self.reshape((n, groups, c // groups) + self.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)


# ---------------------------------------------------------------- im2col / col2im
def _im2col(x, kernel, dilation, padding, stride):
    """(N, C, H, W) -> (N, C * kh * kw, L): every window as a column, channel-major, as
    nn.Unfold lays it out. A gather, so it is exact for every dtype."""
    pads = [(0, 0)] * (x.ndim - 2) + [(p, p) for p in padding]
    x = jnp.pad(x, pads)
    index = []
    for size, k, d, s in zip(x.shape[-2:], kernel, dilation, stride):
        out = (size - d * (k - 1) - 1) // s + 1
        index.append(np.arange(k)[:, None] * d + np.arange(out)[None, :] * s)  # (k, out)
    rows, cols = index
    windows = x[..., rows[:, None, :, None], cols[None, :, None, :]]  # (..., C, kh, kw, oh, ow)
    *batch, channels = x.shape[:-2]
    # sizes spelled out: -1 is ambiguous for an empty batch
    return windows.reshape(
        tuple(batch) + (channels * math.prod(kernel), rows.shape[1] * cols.shape[1]))


@lowering(aten.im2col.default)
def _im2col_lowering(self, kernel_size, dilation, padding, stride):
    return _im2col(self, kernel_size, dilation, padding, stride)


@lowering(aten.col2im.default)
def _col2im(self, output_size, kernel_size, dilation, padding, stride):
    # col2im (nn.Fold) sums overlapping windows back: exactly the transpose of im2col
    channels = self.shape[-2] // math.prod(kernel_size)
    image = self.shape[:-2] + (channels,) + tuple(output_size)
    return _transpose_of(lambda x: _im2col(x, kernel_size, dilation, padding, stride), self,
                         image)
