"""FlexAttention's higher-order ops in compiled graphs: `flex_attention` and
`flex_attention_backward` lowered to JAX, so a compiled graph that calls
`torch.nn.attention.flex_attention` (forward and backward) is one XLA program.

The forward computes what torch's dense implementation defines (the math every backend
must match): scores = q @ k^T (float32, or float64 for float64 inputs) times `scale`;
`score_mod(score, b, h, q_idx, kv_idx, *buffers)` applied to every element and
`mask_mod(b, h, q_idx, kv_idx, *buffers)` choosing which scores stay (others -inf), both
traced subgraphs that compile/lower.py hands over as JAX functions of scalars (`Subgraph`,
interpreted through the lowering table), elementwise under four nested `jax.vmap`s (as torch
vmaps them); grouped-query heads share their kv head (head h reads
kv head h // G); then a softmax whose fully masked rows are 0, and the product with v. It
returns (out, logsumexp / ln 2, row max / ln 2): the HOP's statistics are in base 2,
which `flex_attention` converts back. The block tensors of the BlockMask only say which
blocks a fused kernel may skip; the mask itself is `mask_mod`, so they are not read.

The backward is the vector-Jacobian product of that forward (`jax.vjp`) with respect to
q, k, v and the floating-point buffers of `score_mod`, for the output's and the
logsumexp's cotangents; torch's joint graph is not needed. A fully masked row has
logsumexp -inf and zero gradients (the softmax and logsumexp are computed on a safe row).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

_LN2 = math.log(2.0)
_FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


def _grid(fn, with_score, n_buffers):
    """fn over every (b, h, q_idx, kv_idx): vmapped four times, innermost kv_idx."""
    for level in (3, 2, 1, 0):
        axes = tuple(0 if i == level else None for i in range(4))
        fn = jax.vmap(fn, in_axes=((0,) if with_score else ()) + axes + (None,) * n_buffers)
    return fn


def _forward(q, k, v, score_mod, mask_mod, scale, score_bufs, mask_bufs):
    groups = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
    k = jnp.broadcast_to(k, (q.shape[0],) + k.shape[1:])
    v = jnp.broadcast_to(v, (q.shape[0],) + v.shape[1:])
    work = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    scores = jnp.matmul(q.astype(work), jnp.swapaxes(k.astype(work), -1, -2),
                        precision=jax.lax.Precision.HIGHEST) * scale
    idx = [jnp.arange(n, dtype=dt) for n, dt in zip(scores.shape, score_mod.dtypes[1:5])]
    midx = [jnp.arange(n, dtype=dt) for n, dt in zip(scores.shape, mask_mod.dtypes[:4])]
    kept = _grid(mask_mod, False, len(mask_bufs))(*midx, *mask_bufs).astype(bool)
    modded = _grid(score_mod, True, len(score_bufs))(scores, *idx, *score_bufs).astype(work)
    post = jnp.where(kept, modded, -jnp.inf)
    empty = jnp.all(post == -jnp.inf, axis=-1, keepdims=True)  # (-inf where not kept)
    row_max = jnp.max(jnp.where(empty, 0.0, post), axis=-1, keepdims=True)
    weights = jnp.exp(jnp.where(empty, -jnp.inf, post - row_max))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(empty, 1.0, total)
    lse = jnp.where(empty, -jnp.inf, jnp.log(jnp.where(empty, 1.0, total)) + row_max)[..., 0]
    low = q.dtype in (jnp.bfloat16, jnp.float16)
    out = jnp.matmul(probs.astype(q.dtype), v.astype(q.dtype),
                     preferred_element_type=jnp.float32 if low else None)
    max_scores = jnp.max(post, axis=-1)
    return out.astype(q.dtype), lse / _LN2, max_scores / _LN2


def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                   score_mod_other_buffers=(), mask_mod_other_buffers=(), *, meta=None):
    return _forward(query, key, value, score_mod, block_mask[-1], scale,
                    list(score_mod_other_buffers), list(mask_mod_other_buffers))


def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp,
                            fw_graph, joint_graph, block_mask, scale, kernel_options,
                            score_mod_other_buffers=(), mask_mod_other_buffers=(), *,
                            meta=None):
    buffers = list(score_mod_other_buffers)
    trainable = [i for i, b in enumerate(buffers)
                 if isinstance(b, jax.Array) and b.dtype in _FLOATS]
    mask_bufs = list(mask_mod_other_buffers)

    def primal(q, k, v, *train):
        bufs = list(buffers)
        for i, t in zip(trainable, train):
            bufs[i] = t
        o, lse, _ = _forward(q, k, v, fw_graph, block_mask[-1], scale, bufs, mask_bufs)
        return o, lse

    (o, lse), vjp = jax.vjp(primal, query, key, value, *[buffers[i] for i in trainable])
    cot = (jnp.zeros_like(o) if grad_out is None else grad_out.astype(o.dtype),
           jnp.zeros_like(lse) if grad_logsumexp is None else grad_logsumexp.astype(lse.dtype))
    grads = vjp(cot)
    by_index = dict(zip(trainable, grads[3:]))
    wanted = meta[3] if meta is not None and len(meta) > 3 else [None] * len(buffers)
    captured = tuple(by_index.get(i) if isinstance(w, torch.Tensor) else None
                     for i, w in enumerate(wanted))
    return grads[0], grads[1], grads[2], captured


HOPS = {torch.ops.higher_order.flex_attention: flex_attention,
        torch.ops.higher_order.flex_attention_backward: flex_attention_backward}
