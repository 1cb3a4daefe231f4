"""Matrix products."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lowering


@lowering(aten.mm.default)
def _mm(self, mat2):
    return jnp.matmul(self, mat2)
