"""Losses, forward and backward: classification (nll, cross entropy pieces, BCE), margin,
CTC and regression losses. Reduced-precision inputs compute in float32 (`to_opmath`), as in
nn.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import bounds
from ._dtypes import promote, to_opmath
from .registry import aten, index_bounds, lowering

# at::Reduction
_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _reduced_grad(grad_output, like, reduction):
    """grad_output of a reduced loss, spread back over the elements of `like`."""
    g = to_opmath(grad_output)
    if reduction == _MEAN:
        g = g / like.size
    return jnp.broadcast_to(g, like.shape)


# ---------------------------------------------------------------- classification losses
def _class_axis(x):
    # nll_loss takes (C,), (N, C) or (N, C, d1, ...): classes are dim 0 of a vector, else dim 1
    return 0 if x.ndim == 1 else 1


def _target_weights(target, weight, ignore_index):
    """Per-target weight: weight[target] (1 without weights), 0 where target == ignore_index."""
    ignored = target == ignore_index
    safe = jnp.where(ignored, 0, target)
    w = jnp.ones(target.shape, jnp.float32) if weight is None else to_opmath(weight)[safe]
    return jnp.where(ignored, 0, w), safe


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
@index_bounds(bounds.classes(0, 1, ignore_i=4))
def _nll_loss_forward(self, target, weight, reduction, ignore_index):
    x = to_opmath(self)
    axis = _class_axis(x)
    w, safe = _target_weights(target, weight, ignore_index)
    picked = jnp.squeeze(jnp.take_along_axis(x, jnp.expand_dims(safe, axis), axis=axis), axis)
    loss = -picked * w
    if reduction == _NONE:
        return loss, jnp.zeros((), x.dtype)  # torch leaves total_weight at 0 here
    total_weight = jnp.sum(w)
    if reduction == _SUM:
        return jnp.sum(loss), total_weight
    return jnp.sum(loss) / total_weight, total_weight


@lowering(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
@index_bounds(bounds.classes(1, 2, ignore_i=5))
def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    axis = _class_axis(self)
    w, safe = _target_weights(target, weight, ignore_index)
    g = to_opmath(grad_output)
    if reduction == _MEAN:
        g = g / to_opmath(total_weight)
    classes = lax.broadcasted_iota(safe.dtype, self.shape, axis)
    hit = classes == jnp.expand_dims(safe, axis)
    return jnp.where(hit, jnp.expand_dims(-w * g, axis), 0.0)


@lowering(aten.binary_cross_entropy.default)
def _binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = to_opmath(self), to_opmath(target)
    # torch clamps the logs at -100 so that x = 0 or 1 gives a finite loss
    loss = -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * to_opmath(weight)
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = to_opmath(self), to_opmath(target)
    g = _reduced_grad(grad_output, x, reduction)
    grad = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)  # torch's EPSILON
    if weight is not None:
        grad = grad * to_opmath(weight)
    return grad


@lowering(aten.binary_cross_entropy_with_logits.default)
def _binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None,
                                      reduction=_MEAN):
    x, t = to_opmath(self), to_opmath(target)
    log_sig = jax.nn.log_sigmoid(x)
    if pos_weight is not None:
        loss = (1 - t) * x - ((to_opmath(pos_weight) - 1) * t + 1) * log_sig
    else:
        loss = (1 - t) * x - log_sig
    if weight is not None:
        loss = loss * to_opmath(weight)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------- margin losses
def _frames(x):
    """A (C,), (N, C) or 0-dim input as (N, C) frames: torch's nframe and dim."""
    return x.reshape(1 if x.ndim <= 1 else x.shape[0], 1 if x.ndim == 0 else x.shape[-1])


@lowering(aten.multi_margin_loss.default)
@index_bounds(bounds.classes(0, 1))
def _multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    """sum over i != y of max(0, margin - x[y] + x[i])^p * weight[y], over C; the `where`
    makes the gradient 0 at z == 0, as torch's `z > 0` test does."""
    x = _frames(to_opmath(self))
    t = target.reshape(-1)
    z = margin - jnp.take_along_axis(x, t[:, None], axis=1) + x
    h = jnp.where(p == 1, z, z * z)
    if weight is not None:
        h = h * to_opmath(weight)[t][:, None]
    others = jnp.arange(x.shape[1]) != t[:, None]
    return _reduce(jnp.sum(jnp.where(others & (z > 0), h, 0), axis=1) / x.shape[1], reduction)


@lowering(aten.multi_margin_loss_backward.default)
@index_bounds(bounds.classes(1, 2))
def _multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None,
                                reduction=_MEAN):
    out, vjp = jax.vjp(lambda x: _multi_margin_loss(x, target, p, margin, weight, reduction),
                       to_opmath(self))
    return vjp(to_opmath(grad_output).reshape(out.shape))[0]


def _multilabel_targets(target, classes):
    """-> (valid, safe targets, is_target): a frame's targets are its entries up to the
    first -1; is_target marks the classes they name."""
    t = _frames(target)
    valid = jnp.cumprod(t >= 0, axis=1).astype(jnp.bool_)
    safe = jnp.where(valid, t, 0)
    rows = jnp.arange(t.shape[0])[:, None]
    is_target = jnp.zeros((t.shape[0], classes), jnp.bool_).at[rows, safe].max(valid)
    return valid, safe, is_target


def _multilabel_margin(x, target, reduction):
    """sum over targets j and non-targets i of max(0, 1 - (x[j] - x[i])), over C (a target
    named twice counts twice, as in torch)."""
    x = _frames(to_opmath(x))
    valid, safe, is_target = _multilabel_targets(target, x.shape[1])
    z = 1 - jnp.take_along_axis(x, safe, axis=1)[:, :, None] + x[:, None, :]
    keep = valid[:, :, None] & ~is_target[:, None, :] & (z > 0)
    loss = jnp.sum(jnp.where(keep, z, 0), axis=(1, 2)) / x.shape[1]
    return _reduce(loss, reduction), is_target


@lowering(aten.multilabel_margin_loss_forward.default)
def _multilabel_margin_loss_forward(self, target, reduction):
    loss, is_target = _multilabel_margin(self, target, reduction)
    return loss, is_target.reshape(target.shape)


@lowering(aten.multilabel_margin_loss_backward.default)
def _multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    out, vjp = jax.vjp(lambda x: _multilabel_margin(x, target, reduction)[0], to_opmath(self))
    return vjp(to_opmath(grad_output).reshape(out.shape))[0]


# ---------------------------------------------------------------- CTC loss
def _logsumexp3(a, b, c):
    """log(e^a + e^b + e^c) shifted by the max as torch's CTC kernel forms it (shift 0 when
    all are -inf); log(0) goes through a where, so an unreachable state's gradient is 0,
    not NaN."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, 0, m)
    total = jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)
    return jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1)), -jnp.inf) + m


def _ctc_states(log_probs, targets, target_lengths, blank):
    """The extended targets (blank, l1, blank, l2, ..., blank) per batch, S = 2 * max target
    length + 1 states: -> (log_probs (N, T, C), labels (N, S), valid (N, S), skip (N, S),
    emit (N, T, S)). Targets are (N, max length) or every batch's concatenated; a state
    may skip the blank before it when its label differs from the one two back."""
    lp = jnp.swapaxes(to_opmath(log_probs), 0, 1)
    n, steps = lp.shape[:2]
    tl = np.asarray(target_lengths, np.int64)
    s = np.arange(2 * int(tl.max(initial=0)) + 1)
    label = np.maximum((s - 1) // 2, 0)  # which target an odd state emits
    valid = s < 2 * tl[:, None] + 1
    if targets.ndim == 1:
        starts = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
        labels = jnp.take(targets, starts[:, None] + label, mode="clip")
    else:
        labels = jnp.take(targets, label, axis=1, mode="clip")
    labels = jnp.where((s % 2 == 1) & valid, labels, blank)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(labels[:, None, :], (n, steps, s.size)),
                               axis=2)
    skip = (s >= 2) & (labels != jnp.roll(labels, 2, axis=1))
    return lp, labels, valid, skip, emit


def _shift(x, k, fill=-jnp.inf):
    """x[:, s - k] along the state axis (k < 0 looks ahead), `fill` past the ends."""
    pad = jnp.full(x.shape[:1] + (abs(k),), fill, x.dtype)
    if k > 0:
        return jnp.concatenate([pad, x[:, :-k]], axis=1)
    return jnp.concatenate([x[:, -k:], pad], axis=1)


def _ctc_alpha(emit, valid, skip, target_lengths):
    """torch's forward variables log_alpha (N, T, S): from blank or the first label at
    t = 0, then from the same state, the one before, or (skip) the one two before."""
    tl = np.asarray(target_lengths, np.int64)[:, None]
    s = np.arange(valid.shape[1])
    first = jnp.where((s == 0) | ((s == 1) & (tl > 0)), emit[:, 0], -jnp.inf)

    def step(prev, e):
        two = jnp.where(skip, _shift(prev, 2), -jnp.inf)
        cur = jnp.where(valid, _logsumexp3(prev, _shift(prev, 1), two) + e, -jnp.inf)
        return cur, cur

    _, rest = lax.scan(step, first, jnp.swapaxes(emit[:, 1:], 0, 1))
    return jnp.concatenate([first[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)


def _ctc_beta(emit, valid, skip, input_lengths, target_lengths):
    """torch's backward variables log_beta (N, T, S): from the last label or the final
    blank at each batch's last step, back through the mirrored transitions; -inf after."""
    il = np.asarray(input_lengths, np.int64)[:, None]
    tl = np.asarray(target_lengths, np.int64)[:, None]
    s = np.arange(valid.shape[1])
    ends = (s == 2 * tl) | ((s == 2 * tl - 1) & (tl > 0))
    skip_ahead = _shift(skip, -2, False)

    def step(after, xs):
        e, t = xs
        two = jnp.where(skip_ahead, _shift(after, -2), -jnp.inf)
        cur = jnp.where(valid, _logsumexp3(after, _shift(after, -1), two) + e, -jnp.inf)
        cur = jnp.where(t == il - 1, jnp.where(ends, e, -jnp.inf),
                        jnp.where(t < il - 1, cur, -jnp.inf))
        return cur, cur

    steps = emit.shape[1]
    none = jnp.full(valid.shape, -jnp.inf, emit.dtype)
    _, beta = lax.scan(step, none, (jnp.swapaxes(emit, 0, 1), np.arange(steps)), reverse=True)
    return jnp.swapaxes(beta, 0, 1)


@lowering(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """-> (negative log-likelihood (N,), log_alpha). zero_infinity concerns the gradient
    here: ctc_loss zeroes infinite losses itself."""
    _, _, valid, skip, emit = _ctc_states(log_probs, targets, target_lengths, blank)
    alpha = _ctc_alpha(emit, valid, skip, target_lengths)
    il, tl = np.asarray(input_lengths, np.int64), np.asarray(target_lengths, np.int64)
    # the last two states at each batch's last step (one without targets)
    batch = np.arange(alpha.shape[0])
    last = alpha[batch, np.maximum(il - 1, 0)]
    end, before = last[batch, 2 * tl], last[batch, np.maximum(2 * tl - 1, 0)]
    ll = jnp.where(tl > 0, _logsumexp3(end, before, -jnp.inf), end)
    return -jnp.where(il == 0, jnp.where(tl == 0, 0, -jnp.inf), ll), alpha


@lowering(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                       neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    """torch's formula, exp(lp) - exp(log(sum of alpha * beta over the states of label c)
    + nll - lp): the gradient for log_probs that come from log_softmax (whose backward
    cancels the exp(lp) term). 0 past each input's length, and with zero_infinity for an
    infinite loss."""
    lp, labels, valid, skip, emit = _ctc_states(log_probs, targets, target_lengths, blank)
    beta = _ctc_beta(emit, valid, skip, input_lengths, target_lengths)
    both = to_opmath(log_alpha) + beta  # (N, T, S)
    mine = labels[:, None, :, None] == jnp.arange(lp.shape[2])  # (N, 1, S, C)
    terms = jnp.where(mine, both[..., None], -jnp.inf)
    m = jnp.max(terms, axis=2)
    m = jnp.where(m == -jnp.inf, 0, m)
    lcab = jnp.log(jnp.sum(jnp.exp(terms - m[:, :, None]), axis=2)) + m  # (N, T, C)
    nll = to_opmath(neg_log_likelihood)[:, None, None]
    g = (jnp.exp(lp) - jnp.exp(lcab + nll - lp)) * to_opmath(grad)[:, None, None]
    active = np.arange(lp.shape[1]) < np.asarray(input_lengths)[:, None]
    g = jnp.where(active[..., None], g, 0)
    if zero_infinity:
        g = jnp.where(jnp.isinf(nll), 0, g)
    return jnp.swapaxes(g, 0, 1)


# ---------------------------------------------------------------- regression losses
def _diff(self, target):
    a, b = promote(self, target)
    return to_opmath(a) - to_opmath(b)


@lowering(aten.mse_loss.default)
def _mse_loss(self, target, reduction=_MEAN):
    return _reduce(jnp.square(_diff(self, target)), reduction)


@lowering(aten.mse_loss_backward.default)
def _mse_loss_backward(grad_output, self, target, reduction):
    d = _diff(self, target)
    return 2 * d * _reduced_grad(grad_output, d, reduction)


def _smooth_l1(d, beta):
    z = jnp.abs(d)
    if beta == 0:  # torch: plain L1, avoiding the division by zero
        return z
    return jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)


@lowering(aten.smooth_l1_loss.default)
def _smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    return _reduce(_smooth_l1(_diff(self, target), beta), reduction)


@lowering(aten.smooth_l1_loss_backward.default)
def _smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    d = _diff(self, target)
    g = _reduced_grad(grad_output, d, reduction)
    if beta == 0:
        return jnp.sign(d) * g
    return jnp.where(d <= -beta, -g, jnp.where(d >= beta, g, d / beta * g))


@lowering(aten.huber_loss.default)
def _huber_loss(self, target, reduction=_MEAN, delta=1.0):
    z = jnp.abs(_diff(self, target))
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@lowering(aten.huber_loss_backward.default)
def _huber_loss_backward(grad_output, self, target, reduction, delta):
    d = _diff(self, target)
    g = _reduced_grad(grad_output, d, reduction)
    return jnp.where(d < -delta, -delta * g, jnp.where(d > delta, delta * g, d * g))
