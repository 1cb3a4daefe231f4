"""Factories and value-setting ops: fill, copy, arange, linspace, logspace, eye.

empty/zeros/ones/full/scalar_tensor/*_like/new_* need nothing here: torch's composite
kernels make them from `empty` (a C++ kernel) and fill_/zero_ (below).
"""
from __future__ import annotations

import math

import jax
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
    """arange(end) / arange(start, end) / arange(start, end, step).

    The length depends on the values, so they must be static Python numbers here (the
    executor keys factory scalars by value); the values are start + step * i, computed in
    double (int64 for integers) like torch's CPU kernel and then cast."""
    start, end, step = {1: (0, scalars[0], 1), 2: (*scalars, 1), 3: scalars}[len(scalars)]
    if any(isinstance(s, jax.core.Tracer) for s in (start, end, step)):
        raise TypeError("arange: start, end and step must be static numbers (they decide the length)")
    integral = all(isinstance(s, int) for s in (start, end, step))
    if dtype is not None:
        out = _runtime.jax_dtype(dtype)
    else:
        out = jnp.dtype(jnp.int64) if integral else _float_dtype(None)
    length = max(0, math.ceil((end - start) / step))
    if integral and jnp.issubdtype(out, jnp.integer):
        return start + step * jnp.arange(length, dtype=jnp.int64)
    return (start + step * jnp.arange(length, dtype=jnp.float64)).astype(out)


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
