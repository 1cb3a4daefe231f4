"""Pairwise distances: cdist (the direct sums, or torch's product form for p = 2) and
pdist, forward and backward, with torch's gradient conventions at zero distances."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import _precision as precision
from .linalg import _matmul, _mT
from .registry import aten, lowering


def _use_mm_for_euclid(p, compute_mode, x1, x2):
    """torch's cdist rule: p=2 goes through the |a|^2 + |b|^2 - 2ab product form when
    asked (mode 1), or by default (mode None/0) once either side has more than 25 rows."""
    if p != 2 or compute_mode == 2:
        return False
    return compute_mode == 1 or x1.shape[-2] > 25 or x2.shape[-2] > 25


@lowering(aten._cdist_forward.default)
@precision.sensitive
def _cdist_forward(x1, x2, p, compute_mode):
    if _use_mm_for_euclid(p, compute_mode, x1, x2):
        # torch's _euclidean_dist: the norms ride inside one product, [-2a, |a|^2, 1] .
        # [b, 1, |b|^2], so the rounding (and cancellation) matches its kernel
        sq1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        sq2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        a = jnp.concatenate([-2 * x1, sq1, jnp.ones_like(sq1)], axis=-1)
        b = jnp.concatenate([x2, jnp.ones_like(sq2), sq2], axis=-1)
        return jnp.sqrt(jnp.maximum(_matmul(a, _mT(b)), 0))
    return _distances(x1, x2, p)


def _distances(x1, x2, p):
    """The p-norm distances of every row pair, summed directly."""
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(x1.dtype)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    if p == float("inf"):
        return jnp.max(diff, axis=-1, initial=0)
    return jnp.sum(diff ** p, axis=-1) ** (1 / p)


@lowering(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, cdist):
    """Gradient of cdist wrt x1, with torch's conventions: zero where the distance is 0
    (and, for p < 2, where a coordinate difference is 0)."""
    if grad.size == 0 or x1.size == 0 or x2.size == 0:  # torch: zeros of x1's shape
        return jnp.zeros(x1.shape, x1.dtype)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    dist = cdist[..., None]
    g = grad[..., None]
    zero = jnp.zeros_like(diff)
    if p == 0:
        return jnp.zeros_like(x1)
    if p == 1:
        term = jnp.sign(diff) * g
    elif p == 2:
        term = jnp.where(dist == 0, zero, diff * g / jnp.where(dist == 0, 1, dist))
    elif p == float("inf"):
        term = jnp.sign(diff) * (jnp.abs(diff) == dist) * g
    else:
        safe_dist = jnp.where(dist == 0, 1, dist)
        if p < 2:  # torch's form for p < 2: |diff| ** (p - 2) is inf at a zero difference
            mag = jnp.abs(jnp.where(diff == 0, 1, diff)) ** (p - 1)
            term = jnp.where((dist == 0) | (diff == 0), zero,
                             jnp.sign(diff) * mag * g / safe_dist ** (p - 1))
        else:
            term = jnp.where(dist == 0, zero, diff * jnp.abs(diff) ** (p - 2) * g / safe_dist ** (p - 1))
    return jnp.sum(term, axis=-2)


def _pairs(n):
    """The (i, j), i < j, row pairs pdist lists, in its order."""
    return np.triu_indices(n, 1)


@lowering(aten._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    # torch's kernel sums |x_i - x_j|^p directly (never the product form cdist may use)
    return _distances(self, self, p)[_pairs(self.shape[0])]


@lowering(aten._pdist_backward.default)
def _pdist_backward(grad, self, p, pdist):
    """cdist's gradient over the symmetric matrices of the pairs: each pair's term goes to
    both rows, with the sign of its difference (every term is odd in it)."""
    n = self.shape[0]
    i, j = _pairs(n)
    full = jnp.zeros((n, n), grad.dtype).at[i, j].set(grad)
    dist = jnp.zeros((n, n), pdist.dtype).at[i, j].set(pdist)
    return _cdist_backward(full + full.T, self, self, p, dist + dist.T)
