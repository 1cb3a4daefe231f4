"""The three FFT primitives every torch.fft function reaches: real-to-complex,
complex-to-real and complex-to-complex transforms over a list of dims.

torch's `normalization` is aten's fft_norm_mode and scales the transform as computed,
whichever direction it runs: 0 = none, 1 = by 1/sqrt(n), 2 = by 1/n (n the product of the
signal sizes). JAX names the same scalings after the direction, so the mapping flips for
inverse transforms (whose unscaled form JAX calls "forward").
"""
from __future__ import annotations

import jax.numpy as jnp

from .registry import aten, lowering

_FORWARD_NORM = ("backward", "ortho", "forward")
_INVERSE_NORM = ("forward", "ortho", "backward")


@lowering(aten._fft_r2c.default)
def _fft_r2c(self, dim, normalization, onesided):
    norm = _FORWARD_NORM[normalization]
    if onesided:
        # rfftn halves the last of `axes`, as torch halves dim[-1]
        return jnp.fft.rfftn(self, axes=dim, norm=norm)
    return jnp.fft.fftn(self, axes=dim, norm=norm)


@lowering(aten._fft_c2r.default)
def _fft_c2r(self, dim, normalization, last_dim_size):
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(self, s=sizes, axes=dim, norm=_INVERSE_NORM[normalization])


@lowering(aten._fft_c2c.default)
def _fft_c2c(self, dim, normalization, forward):
    if not dim:
        return self
    if forward:
        return jnp.fft.fftn(self, axes=dim, norm=_FORWARD_NORM[normalization])
    return jnp.fft.ifftn(self, axes=dim, norm=_INVERSE_NORM[normalization])
