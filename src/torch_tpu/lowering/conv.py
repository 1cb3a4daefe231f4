"""Convolution, pooling and upsampling, forward and backward, for 1, 2 and 3 spatial dims.

Layouts are torch's (N, C, *spatial) inputs and (O, I/groups, *kernel) weights, which are
lax.conv_general_dilated's defaults. Backward ops that are linear in their input
(convolution, average pooling, upsampling) are the JAX vjp of the forward lowering, so
forward and backward can never disagree; max pooling scatters through its indices, as
torch's kernels do.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .nn import _opmath
from .registry import aten, lowering


def _precision(dtype):
    # torch computes float32 convolutions in full float32 unless TF32 is asked for; XLA on
    # TPU would otherwise use a single bf16 pass
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _expand(v, n):
    """torch lets an int[2] / int[3] argument be one value for every spatial dim."""
    v = tuple(v)
    return v * n if len(v) == 1 else v


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
            feature_group_count=groups, precision=_precision(dtype), preferred_element_type=acc)
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
        feature_group_count=groups, precision=_precision(dtype), preferred_element_type=acc)


@lowering(aten.convolution.default)
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + _opmath(bias).reshape((-1,) + (1,) * (out.ndim - 2))
    return out


@lowering(aten.convolution_backward.default)
def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    def conv(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        out, vjp = jax.vjp(conv, input, weight)
        grad_input, grad_weight = vjp(grad_output.astype(out.dtype))
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(_opmath(grad_output), axis=axes)
    return (grad_input if output_mask[0] else None,
            grad_weight if output_mask[1] else None,
            grad_bias)


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
    g = _opmath(grad_output).reshape(-1, math.prod(grad_output.shape[-nd:]))
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


# ---------------------------------------------------------------- average pooling
def _avg_pool(x, nd, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, dilation = _pool_args(nd, kernel, stride, padding)
    x = _opmath(x)
    spatial = x.shape[-nd:]
    geo = [_pool_geometry(*a, ceil_mode) for a in zip(spatial, kernel, stride, padding, dilation)]
    out, pads = [g[0] for g in geo], [g[1] for g in geo]
    zero = jnp.array(0, x.dtype)
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
    _, vjp = jax.vjp(lambda x: _avg_pool(x, nd, *args), _opmath(self))
    return vjp(_opmath(grad_output))[0]


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
    x = _opmath(x)
    counts = 1.0
    for axis, (size, out) in enumerate(zip(x.shape[-nd:], output_size)):
        start, end = _adaptive_bins(size, out)
        pos = np.arange(size)
        member = ((pos >= start[:, None]) & (pos < end[:, None])).astype(np.float32)
        # sum each bin with a 0/1 matrix along this axis, then divide once, as torch does
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(member, x.dtype).T, axes=([x.ndim - nd + axis], [0]),
                                       precision=_precision(x.dtype)), -1, x.ndim - nd + axis)
        shape = [1] * nd
        shape[axis] = out
        counts = counts * (end - start).reshape(shape)
    return x / jnp.asarray(counts, x.dtype)


def _adaptive_avg_backward(grad_output, self, nd):
    _, vjp = jax.vjp(lambda x: _adaptive_avg(x, grad_output.shape[-nd:]), _opmath(self))
    return vjp(_opmath(grad_output))[0]


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
