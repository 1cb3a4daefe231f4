"""Scaled dot-product attention as one op each way: torch's "overrideable" SDPA backend.

`F.scaled_dot_product_attention` on tpu tensors picks this backend (csrc/dispatch.cpp,
`sdp_choice`) instead of the math path's dozen small ops; torch's autograd formula
connects the forward to its backward. The values follow the math path:
softmax(q @ k^T * scale + mask) @ v, with
- scale 1/sqrt(E) unless given;
- is_causal: query i sees keys 0..i (the top-left aligned lower triangle);
- a bool mask keeps where True, a float mask is added;
- grouped-query attention: key/value head j serves query heads j*r .. j*r+r-1
  (repeat_interleave, as the math path does), their gradients summed back;
- a query row that sees no key at all gives zeros (torch's _safe_softmax), not NaN;
- 16-bit floats compute in float32;
- the two products take the float32 matmul precision (`_precision.for_matmul`), as the
  math path's bmm calls would.
The backward recomputes the forward inside its program (XLA fuses it) rather than reading
a saved probability matrix; the saved logsumexp is the statistic torch's schema carries.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import _precision as precision
from ._dtypes import to_opmath
from .registry import aten, lowering, never_draws


def _scores(q, k, bias, is_causal, scale, prec):
    """(q, k) -> the scaled logits, -inf where the mask or causality excludes a key."""
    s = jnp.einsum("...qd,...kd->...qk", q, k, precision=prec) * scale
    keep = None
    if is_causal:
        L, S = s.shape[-2], s.shape[-1]
        keep = jnp.tril(jnp.ones((L, S), bool))
    if bias is not None:
        if bias.dtype == jnp.bool_:
            keep = bias if keep is None else keep & bias
        else:
            s = s + bias.astype(s.dtype)
    if keep is not None:
        s = jnp.where(keep, s, -jnp.inf)
    return s


def _attend(q, k, v, bias, is_causal, scale):
    """-> (out, logsumexp over the keys), both in the compute dtype (to_opmath's)."""
    # 16-bit inputs: one bfloat16 pass multiplies them exactly, as for their bmm
    prec = precision.for_matmul(q.dtype)
    q, k, v = to_opmath(q), to_opmath(k), to_opmath(v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    groups = q.shape[-3] // k.shape[-3]
    if groups > 1:
        k = jnp.repeat(k, groups, axis=-3)
        v = jnp.repeat(v, groups, axis=-3)
    s = _scores(q, k, bias, is_causal, scale, prec)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # rows with no key: exp(-inf - 0) = 0
    e = jnp.exp(s - m)
    z = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(z == 0, 1.0, z)
    lse = (jnp.log(z) + m)[..., 0]
    return jnp.einsum("...qk,...kd->...qd", p, v, precision=prec), lse


@lowering(aten._scaled_dot_product_fused_attention_overrideable.default)
@precision.sensitive
@never_draws
def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                  return_debug_mask=False, *, scale=None):
    if dropout_p > 0:  # sdp_choice keeps dropout on the math path
        raise NotImplementedError("tpu's fused attention has no dropout")
    out, lse = _attend(query, key, value, attn_bias, is_causal, scale)
    zero = jnp.zeros((), jnp.int64)  # philox seed and offset: no randomness here
    # one value per schema return; None where torch's meta gives no tensor (the cumulative
    # sequence lengths and debug mask of nested inputs) or a size (max_q, max_k: the
    # backward does not read them)
    return (out.astype(query.dtype), lse.astype(jnp.float32), None, None, None, None,
            zero, zero, None)


@lowering(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
@precision.sensitive
@never_draws
def _sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                   cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                   philox_offset, *, scale=None):
    float_bias = attn_bias is not None and attn_bias.dtype != jnp.bool_

    def forward(q, k, v, b):
        return _attend(q, k, v, b if float_bias else attn_bias, is_causal, scale)[0]

    bias_in = attn_bias if float_bias else jnp.zeros((), jnp.float32)
    _, vjp = jax.vjp(forward, query, key, value, bias_in)
    gq, gk, gv, gb = vjp(to_opmath(grad_out))  # the forward's output dtype
    grads = [gq.astype(query.dtype), gk.astype(key.dtype), gv.astype(value.dtype)]
    if attn_bias is not None:  # torch's meta returns a gradient for any given mask
        grads.append(gb.astype(attn_bias.dtype) if float_bias else jnp.zeros_like(attn_bias))
    return tuple(grads)
