"""Factories and value-setting ops: fill, copy, arange, linspace, eye."""
from __future__ import annotations

import jax.numpy as jnp

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
