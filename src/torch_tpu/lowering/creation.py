"""Factories and value-setting ops: fill, copy, arange, linspace, logspace, eye.

empty/zeros/ones/full/scalar_tensor/*_like/new_* need nothing here: torch's composite
kernels make them from `empty` (a C++ kernel) and fill_/zero_ (below).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from .. import _runtime
from .registry import aten, lowering


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def _fill(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lowering(aten.copy.default)
def _copy(self, src, non_blocking=False):
    return jnp.broadcast_to(jnp.asarray(src).astype(self.dtype), self.shape)


@lowering(aten.zero.default)
def _zero(self):
    return jnp.zeros(self.shape, self.dtype)


@lowering(aten.clone.default)
def _clone(self, memory_format=None):
    return self


def _float_dtype(dtype):
    """A factory's dtype: the one asked for, else torch's default float dtype."""
    return _runtime.jax_dtype(dtype if dtype is not None else torch.get_default_dtype())


# ---------------------------------------------------------------- arange
@lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(*scalars, dtype=None, layout=None, device=None, pin_memory=None):
    """arange(end) / arange(start, end) / arange(start, end, step), as torch's CPU kernel.

    The length depends on the values, so they arrive as static Python numbers (the
    executor keys factory scalars by value)."""
    start, end, step = {1: (0, scalars[0], 1), 2: (*scalars, 1), 3: scalars}[len(scalars)]
    if dtype is None:
        integral = all(isinstance(s, int) for s in (start, end, step))
        dtype = torch.int64 if integral else torch.get_default_dtype()
    out = _runtime.jax_dtype(dtype)
    if jnp.issubdtype(out, jnp.floating):
        # values in double, the length from the double quotient
        length = math.ceil((end - start) / step)
        return (start + step * jnp.arange(length, dtype=jnp.float64)).astype(out)
    # integer results: torch truncates start, end and step to int64 first; int64 results
    # take their length from those, other integer types from the original quotient
    istart, iend, istep = int(start), int(end), int(step)
    if dtype == torch.int64:
        if istep == 0:  # a fractional step truncated to 0, as CPU refuses it
            raise ValueError("step must be nonzero")
        sign = (istep > 0) - (istep < 0)
        length = int((iend - istart + istep - sign) / istep)
    else:
        length = math.ceil((end - start) / step)
    return (istart + istep * jnp.arange(length, dtype=jnp.int64)).astype(out)


# ---------------------------------------------------------------- linspace / logspace
def _ramp(start, end, steps, dtype):
    """torch's linspace: start + step * i for the first half, end - step * (steps - 1 - i)
    for the second, so both ends are exact. Integer results are computed in double."""
    compute = dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.float64
    start = jnp.asarray(start).astype(compute)
    end = jnp.asarray(end).astype(compute)
    if steps == 1:
        return jnp.reshape(start, (1,))
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps)
    return jnp.where(i < steps // 2, start + step * i.astype(compute),
                     end - step * (steps - 1 - i).astype(compute))


def _to(x, dtype):
    # C++ static_cast truncates toward zero; astype from float to int does the same
    return x.astype(dtype)


@lowering(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
          aten.linspace.Scalar_Tensor)
def _linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    out = _float_dtype(dtype)
    return _to(_ramp(start, end, steps, out), out)


@lowering(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
          aten.logspace.Scalar_Tensor)
def _logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None,
              pin_memory=None):
    out = _float_dtype(dtype)
    exponent = _ramp(start, end, steps, out)
    return _to(jnp.power(jnp.asarray(base, exponent.dtype), exponent), out)


# ---------------------------------------------------------------- eye
@lowering(aten.eye.default, aten.eye.m)
def _eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=_float_dtype(dtype))
