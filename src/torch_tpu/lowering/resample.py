"""Upsampling (nearest, linear, bicubic, antialiased) and grid sampling, forward and
backward, for 1, 2 and 3 spatial dims. Resizing is a matrix per spatial dim
(conv._contract_trailing); backward ops are the JAX vjp of the forward lowering, so
forward and backward can never disagree."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from .conv import _contract_trailing, _transpose_of
from ._dtypes import to_opmath
from .registry import aten, lowering


# ---------------------------------------------------------------- upsampling
def _scale_value(size, out, scale, ft=np.float32):
    # torch's compute_scales_value in the kernel's float type (float32; double for a
    # float64 input's linear, cubic and antialiased weights): 1/scale_factor when given
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(size) / ft(out)


def _nearest_source(size, out, scale, exact):
    """The input index each output index copies (torch's nearest_idx / nearest_exact_idx)."""
    dst = np.arange(out)
    s = _scale_value(size, out, scale)
    if exact:
        src = np.floor(((dst + 0.5) * np.float64(s)).astype(np.float32))
    elif out == size:
        return dst
    elif out == 2 * size:
        return dst >> 1
    else:
        src = np.floor(dst.astype(np.float32) * s)
    return np.minimum(src.astype(np.int64), size - 1)


def _nearest(x, output_size, scales, exact):
    nd = len(output_size)
    for axis, (size, out, scale) in enumerate(zip(x.shape[-nd:], output_size, scales)):
        x = jnp.take(x, _nearest_source(size, out, scale, exact), axis=x.ndim - nd + axis)
    return x


_CUBIC_A = -0.75  # torch's bicubic convolution constant


def _cubic_weights(t):
    """torch's get_cubic_upsample_coefficients: the weights of the inputs at floor(src) - 1
    .. floor(src) + 2 for the fractional offsets t."""
    a = _CUBIC_A

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _interp_matrix(size, out, align_corners, scale, dtype, cubic, antialias=False):
    """(out, size) weights of torch's linear or cubic interpolation, with the source
    positions computed in the float type torch uses (area_pixel_compute_source_index)."""
    if out == size:  # torch copies when the size does not change, whatever the scale
        return np.eye(size)
    ft = np.float64 if dtype == jnp.float64 else np.float32
    if antialias:
        return _antialias_matrix(size, out, align_corners, scale, ft, cubic)
    dst = np.arange(out, dtype=ft)
    if align_corners:
        src = dst * (ft(size - 1) / ft(out - 1) if out > 1 else ft(0))
    else:
        src = (dst + ft(0.5)) * _scale_value(size, out, scale, ft) - ft(0.5)
        if not cubic:
            src = np.maximum(src, ft(0))  # linear clamps the position at 0; cubic does not
    m = np.zeros((out, size), np.float64)
    rows = np.arange(out)
    base = np.floor(src).astype(np.int64)
    if cubic:
        for k, w in enumerate(_cubic_weights(src - base)):
            np.add.at(m, (rows, np.clip(base - 1 + k, 0, size - 1)), w)
        return m
    lo = np.minimum(base, size - 1)
    hi = lo + (lo < size - 1)
    lam = np.clip(src - lo, 0, 1)
    np.add.at(m, (rows, lo), 1 - lam)
    np.add.at(m, (rows, hi), lam)
    return m


def _aa_filter(x, cubic):
    """torch's antialiasing filters: the triangle, or Keys' cubic with a = -0.5 (not the
    -0.75 of plain bicubic)."""
    x = np.abs(x)
    if not cubic:
        return np.where(x < 1, 1 - x, 0).astype(x.dtype)
    a = x.dtype.type(-0.5)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(x.dtype)


def _antialias_matrix(size, out, align_corners, scale, ft, cubic):
    """torch's _compute_weights_aa: output i averages the inputs within `support` of its
    center scale * (i + 0.5) under the filter stretched by the scale when downsampling,
    normalized to sum 1. align_corners changes only the scale."""
    if align_corners:
        s = ft(size - 1) / ft(out - 1) if out > 1 else ft(0)
    else:
        s = _scale_value(size, out, scale, ft)
    half = ft(2 if cubic else 1)  # half the filter's width
    support, invscale = (half * s, ft(1) / s) if s >= 1 else (half, ft(1))
    m = np.zeros((out, size), ft)
    for i in range(out):
        center = s * ft(i + 0.5)
        lo = max(int(center - support + ft(0.5)), 0)
        hi = min(int(center + support + ft(0.5)), size)
        w = _aa_filter((np.arange(lo, hi).astype(ft) - center + ft(0.5)) * invscale, cubic)
        total = w.sum(dtype=ft)
        m[i, lo:hi] = w / total if total != 0 else w
    return m


def _interpolate(x, output_size, align_corners, scales, cubic=False, antialias=False):
    x = to_opmath(x)
    nd = len(output_size)
    mats = [_interp_matrix(size, out, align_corners, scale, x.dtype, cubic, antialias)
            for size, out, scale in zip(x.shape[-nd:], output_size, scales)]
    return _contract_trailing(x, mats)


def _register_nearest(name, exact):
    @lowering(getattr(aten, name).default)
    def forward(self, output_size, *scales):
        return _nearest(self, output_size, scales, exact)

    @lowering(getattr(aten, name + "_backward").default)
    def backward(grad_output, output_size, input_size, *scales):
        return _transpose_of(lambda x: _nearest(x, output_size, scales, exact), grad_output,
                             input_size)


def _register_interpolation(name, cubic, antialias=False):
    def resample(x, output_size, align_corners, scales):
        return _interpolate(x, output_size, align_corners, scales, cubic, antialias)

    @lowering(getattr(aten, name).default)
    def forward(self, output_size, align_corners, *scales):
        return resample(self, output_size, align_corners, scales)

    @lowering(getattr(aten, name + "_backward").default)
    def backward(grad_output, output_size, input_size, align_corners, *scales):
        return _transpose_of(lambda x: resample(x, output_size, align_corners, scales),
                             grad_output, input_size)


# the .vec overloads are CompositeImplicitAutograd and arrive here as these
for _nd, _linear in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"),
                     (3, "upsample_trilinear3d")):
    _register_nearest(f"upsample_nearest{_nd}d", exact=False)
    _register_nearest(f"_upsample_nearest_exact{_nd}d", exact=True)
    _register_interpolation(_linear, cubic=False)
_register_interpolation("upsample_bicubic2d", cubic=True)
_register_interpolation("_upsample_bilinear2d_aa", cubic=False, antialias=True)
_register_interpolation("_upsample_bicubic2d_aa", cubic=True, antialias=True)


# ---------------------------------------------------------------- grid sampling
_BILINEAR, _NEAREST = 0, 1  # GridSamplerInterpolation (2: bicubic)
_BORDER, _REFLECTION = 1, 2  # GridSamplerPadding (0: zeros)


def _unnormalize(coord, size, align_corners):
    """A grid coordinate in [-1, 1] -> a position in input pixels."""
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(x, size):
    # where, not jnp.clip: torch's gradient is 0 on the bounds themselves, not 1/2
    return jnp.where(x <= 0, 0, jnp.where(x >= size - 1, size - 1, x))


def _reflect(x, twice_low, twice_high):
    """torch's reflect_coordinates: x mirrored at low and high until it lies between."""
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    x = jnp.abs(x - low)
    extra = jnp.fmod(x, span)
    even = jnp.fmod(jnp.floor(x / span), 2) == 0
    return jnp.where(even, extra + low, span - extra + low)


def _padded(x, size, padding_mode, align_corners):
    """torch's compute_coordinates: the position a sample outside the input reads from
    (zeros padding keeps it, and the read gives 0)."""
    if padding_mode == _BORDER:
        return _clip(x, size)
    if padding_mode == _REFLECTION:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return _clip(_reflect(x, *twice), size)
    return x


@lowering(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    x, g = to_opmath(input), to_opmath(grid)
    nd = x.ndim - 2
    sizes = x.shape[2:]
    out_shape = x.shape[:2] + g.shape[1:-1]
    if x.size == 0:
        return jnp.zeros(out_shape, x.dtype)
    # the grid's last axis is (x, y[, z]): the spatial axes (D,) H, W in reverse
    pos = [_unnormalize(g[..., nd - 1 - d], sizes[d], align_corners) for d in range(nd)]
    channels_last = jnp.moveaxis(x, 1, -1)
    batch = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * nd)

    def read(idx):
        """The input at integer-valued positions (one array per spatial dim), (N, *out, C);
        0 outside the input."""
        inside = True
        for i, s in zip(idx, sizes):
            inside = inside & (i >= 0) & (i <= s - 1)
        safe = [jnp.clip(i, 0, s - 1).astype(jnp.int32) for i, s in zip(idx, sizes)]
        return jnp.where(inside[..., None], channels_last[(batch, *safe)], 0)

    if interpolation_mode == _NEAREST:
        out = read([jnp.round(_padded(p, s, padding_mode, align_corners))  # half to even
                    for p, s in zip(pos, sizes)])
    elif interpolation_mode == _BILINEAR:
        pos = [_padded(p, s, padding_mode, align_corners) for p, s in zip(pos, sizes)]
        lo = [jnp.floor(p) for p in pos]
        out = 0
        for corner in itertools.product((0, 1), repeat=nd):
            weight = 1
            for p, low, c in zip(pos, lo, corner):
                weight = weight * (p - low if c else low + 1 - p)
            out = out + read([low + c for low, c in zip(lo, corner)]) * weight[..., None]
    else:  # bicubic, 2d only: 4x4 taps at the unpadded position, each tap padded itself
        lo = [jnp.floor(p) for p in pos]
        weights = [_cubic_weights(p - low) for p, low in zip(pos, lo)]
        out = 0
        for ky, kx in itertools.product(range(4), repeat=2):
            taps = [jnp.trunc(_padded(low - 1 + k, s, padding_mode, align_corners))
                    for low, k, s in zip(lo, (ky, kx), sizes)]
            out = out + read(taps) * (weights[0][ky] * weights[1][kx])[..., None]
    return jnp.moveaxis(out, -1, 1)


@lowering(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def _grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                           align_corners, output_mask):
    _, vjp = jax.vjp(
        lambda x, g: _grid_sampler(x, g, interpolation_mode, padding_mode, align_corners),
        to_opmath(input), to_opmath(grid))
    grad_input, grad_grid = vjp(to_opmath(grad_output))
    return grad_input if output_mask[0] else None, grad_grid
