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
Both directions work a block pair at a time, FlashAttention's way (`_Problem`): the forward
keeps a running max and sum per query row, the backward recomputes each block's
probabilities from the saved logsumexp, so no L x S matrix is ever whole (`_Problem`).
On the CPU platform, attention without a mask runs ATen's CPU flash-attention kernels
instead (_cpu_kernels.py), as CPU torch does.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .. import _cpu_kernels
from .. import _precision as precision
from ._dtypes import to_opmath
from .registry import aten, lowering, never_draws


BLOCK = 64  # query and key block length (measured on XLA:CPU: 64 beat 32, 128 and 256)


def _pad_to(x, axis, n, value=0):
    extra = n - x.shape[axis]
    if extra <= 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _cut(x, start, axis):
    return lax.dynamic_slice_in_dim(x, start, BLOCK, axis=axis % x.ndim)


def _add_at(x, block, start, axis):
    return lax.dynamic_update_slice_in_dim(x, _cut(x, start, axis) + block, start,
                                           axis=axis % x.ndim)


class _Problem:
    """One attention call in the compute dtype, worked a block pair at a time.

    Scores are never a whole L x S matrix: on XLA:CPU the whole-matrix passes (exp, max,
    sum, their gradients) are memory-bound, and took ~6x torch's fused CPU kernel (a
    4 x 16 x 512 x 16 causal forward and backward: 474 ms against 80 ms); a 64 x 64 block
    pair stays in cache. The blocks are loops (a scan over query blocks, a loop over the
    key blocks each sees), so the program's size, and its compile time, do not grow with
    the length; causal attention stops each query block's loop at the diagonal. Lengths
    are padded to whole blocks: padded keys are masked, padded queries dropped."""

    def __init__(self, q, k, v, bias, is_causal, scale, prec):
        self.prec = prec  # precision.for_matmul of the inputs' dtype (bf16: one pass)
        q, k, v = to_opmath(q), to_opmath(k), to_opmath(v)
        self.groups = q.shape[-3] // k.shape[-3]
        if self.groups > 1:  # key/value head j serves query heads j*r .. j*r+r-1
            k = jnp.repeat(k, self.groups, axis=-3)
            v = jnp.repeat(v, self.groups, axis=-3)
        self.L, self.S = q.shape[-2], k.shape[-2]
        self.nq, self.nk = -(-self.L // BLOCK), max(1, -(-self.S // BLOCK))
        self.q = _pad_to(q, -2, self.nq * BLOCK)
        self.k = _pad_to(k, -2, self.nk * BLOCK)
        self.v = _pad_to(v, -2, self.nk * BLOCK)
        self.batch = q.shape[:-2]
        self.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        self.causal = is_causal
        self.bias = None
        if bias is not None:  # its rank made the scores', its full dims padded
            b = bias.reshape((1,) * (q.ndim - bias.ndim) + bias.shape)
            if b.shape[-2] != 1:
                b = _pad_to(b, -2, self.nq * BLOCK, b.dtype.type(b.dtype == jnp.bool_))
            if b.shape[-1] != 1:
                b = _pad_to(b, -1, self.nk * BLOCK, b.dtype.type(b.dtype == jnp.bool_))
            self.bias = b

    def keys_seen(self, i):
        """How many key blocks query block i sees (causal: up to its diagonal)."""
        if not self.causal:
            return self.nk
        if isinstance(i, int):
            return min(i + 1, self.nk)
        return jnp.minimum(i + 1, self.nk)

    def loop(self, i, body, init):
        """body over the key blocks query block i sees; one block (short sequences) is a
        plain call: a loop of one costs compile time for nothing."""
        n = self.keys_seen(i)
        if isinstance(n, int) and n == 1:
            return body(0, init)
        return lax.fori_loop(0, n, body, init)

    def over_queries(self, fn, init=None):
        """fn over the query blocks (a scan when `init` is given), stacked on axis 0."""
        if self.nq == 1:
            if init is None:
                return tuple(x[None] for x in fn(0))
            carry, y = fn(init, 0)
            return carry, y[None]
        if init is None:
            return lax.map(fn, jnp.arange(self.nq))
        return lax.scan(fn, init, jnp.arange(self.nq))

    def scores(self, i, j):
        """Block pair (i, j)'s scaled logits, -inf where a mask, causality or padding
        excludes a key."""
        s = jnp.einsum("...qd,...kd->...qk", _cut(self.q, i * BLOCK, -2),
                       _cut(self.k, j * BLOCK, -2), precision=self.prec) * self.scale
        rows = i * BLOCK + jnp.arange(BLOCK)[:, None]
        cols = j * BLOCK + jnp.arange(BLOCK)[None, :]
        keep = cols < self.S
        if self.causal:
            keep = keep & (rows >= cols)
        b = self.bias
        if b is not None:
            b = _cut(b, i * BLOCK, -2) if b.shape[-2] != 1 else b
            b = _cut(b, j * BLOCK, -1) if b.shape[-1] != 1 else b
            if b.dtype == jnp.bool_:
                keep = keep & b
            else:
                s = s + b.astype(s.dtype)
        return jnp.where(keep, s, -jnp.inf)

    def forward(self):
        """-> (out, logsumexp over the keys): an online softmax over the key blocks."""
        rows = self.batch + (BLOCK, 1)

        def query_block(i):
            def key_block(j, carry):
                m, l, acc = carry
                s = self.scores(i, j)
                m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
                m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # no key yet: exp(-inf) = 0
                p = jnp.exp(s - m_safe)
                corr = jnp.exp(jnp.where(jnp.isfinite(m), m, 0.0) - m_safe) * jnp.isfinite(m)
                pv = jnp.einsum("...qk,...kd->...qd", p, _cut(self.v, j * BLOCK, -2),
                                precision=self.prec)
                return m_new, l * corr + jnp.sum(p, axis=-1, keepdims=True), acc * corr + pv

            dt = self.q.dtype
            init = (jnp.full(rows, -jnp.inf, dt), jnp.zeros(rows, dt),
                    jnp.zeros(self.batch + (BLOCK, self.v.shape[-1]), dt))
            m, l, acc = self.loop(i, key_block, init)
            seen = l > 0  # a row with no key: zeros, and logsumexp -inf
            out = acc / jnp.where(seen, l, 1.0)
            lse = jnp.where(seen, jnp.log(jnp.where(seen, l, 1.0)) + m, -jnp.inf)
            return out, lse[..., 0]

        outs, lses = self.over_queries(query_block)
        return self._unblock(outs), self._unblock(lses[..., None])[..., 0]

    def _unblock(self, x):
        """[nq, ..., BLOCK, d] blocks -> [..., L, d]."""
        x = jnp.moveaxis(x, 0, -3)
        return x.reshape(x.shape[:-3] + (-1, x.shape[-1]))[..., :self.L, :]

    def backward(self, grad_out, out, lse, bias_grad):
        """-> (dq, dk, dv, d(float bias) or None), from the saved output and logsumexp:
        p = exp(s - lse), dv = p^T dO, ds = p (dO v^T - rowsum(dO * O)), dq = ds k,
        dk = ds^T q (times the scale), block pair by block pair."""
        n = self.nq * BLOCK
        go = _pad_to(to_opmath(grad_out), -2, n)
        delta = _pad_to(jnp.sum(to_opmath(grad_out) * to_opmath(out), axis=-1), -1, n)
        lse = _pad_to(lse.astype(self.q.dtype), -1, n)
        lse = jnp.where(jnp.isfinite(lse), lse, jnp.inf)  # a row with no key: p = 0
        want_bias = bias_grad and self.bias is not None and self.bias.dtype != jnp.bool_
        full = self.batch + (n, self.nk * BLOCK)

        def query_block(carry, i):
            g, d = _cut(go, i * BLOCK, -2), _cut(delta, i * BLOCK, -1)[..., None]
            l_i, q_i = _cut(lse, i * BLOCK, -1)[..., None], _cut(self.q, i * BLOCK, -2)

            def key_block(j, c):
                dq, dk, dv, db = c
                p = jnp.exp(self.scores(i, j) - l_i)
                dp = jnp.einsum("...qd,...kd->...qk", g, _cut(self.v, j * BLOCK, -2),
                                precision=self.prec)
                ds = p * (dp - d)
                dq = dq + jnp.einsum("...qk,...kd->...qd", ds, _cut(self.k, j * BLOCK, -2),
                                     precision=self.prec)
                dk = _add_at(dk, jnp.einsum("...qk,...qd->...kd", ds, q_i,
                                            precision=self.prec), j * BLOCK, -2)
                dv = _add_at(dv, jnp.einsum("...qk,...qd->...kd", p, g, precision=self.prec),
                             j * BLOCK, -2)
                if want_bias:
                    db = lax.dynamic_update_slice(db, ds, (0,) * len(self.batch)
                                                  + (i * BLOCK, j * BLOCK))
                return dq, dk, dv, db

            dq, *rest = self.loop(i, key_block, (jnp.zeros_like(q_i), *carry))
            return tuple(rest), dq

        init = (jnp.zeros_like(self.k), jnp.zeros_like(self.v),
                jnp.zeros(full, self.q.dtype) if want_bias else jnp.zeros((), self.q.dtype))
        (dk, dv, db), dq = self.over_queries(query_block, init)
        dq = self._unblock(dq) * self.scale
        dk, dv = dk[..., :self.S, :] * self.scale, dv[..., :self.S, :]
        if self.groups > 1:  # the shared key/value heads' gradients, summed back
            def fold(x):
                return x.reshape(x.shape[:-3] + (-1, self.groups) + x.shape[-2:]).sum(-3)
            dk, dv = fold(dk), fold(dv)
        if not want_bias:
            return dq, dk, dv, None
        db = db[..., :self.L, :self.S]
        dims = tuple(a for a, size in enumerate(self.bias.shape) if size == 1 and db.shape[a] != 1)
        return dq, dk, dv, db.sum(axis=dims, keepdims=True) if dims else db


@lowering(aten._scaled_dot_product_fused_attention_overrideable.default)
@precision.sensitive
@never_draws
def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                  return_debug_mask=False, *, scale=None):
    if dropout_p > 0:  # sdp_choice keeps dropout on the math path
        raise NotImplementedError("tpu's fused attention has no dropout")
    if _cpu_kernels.attention_qualifies(query, key, value, attn_bias, scale):
        out, lse = _cpu_kernels.attention(query, key, value, is_causal, scale)
    else:
        prec = precision.for_matmul(query.dtype)
        out, lse = _Problem(query, key, value, attn_bias, is_causal, scale, prec).forward()
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
    if _cpu_kernels.attention_qualifies(query, key, value, attn_bias, scale):
        return _cpu_kernels.attention_backward(grad_out, query, key, value, out, logsumexp,
                                               is_causal, scale)
    problem = _Problem(query, key, value, attn_bias, is_causal, scale,
                       precision.for_matmul(query.dtype))
    bias_grad = len(grad_input_mask) > 3 and grad_input_mask[3]
    gq, gk, gv, gb = problem.backward(grad_out, out, logsumexp, bias_grad)
    grads = [gq.astype(query.dtype), gk.astype(key.dtype), gv.astype(value.dtype)]
    if attn_bias is not None:  # torch's meta returns a gradient for any given mask
        grads.append(gb.reshape(attn_bias.shape).astype(attn_bias.dtype) if gb is not None
                     else jnp.zeros_like(attn_bias))
    return tuple(grads)
