"""Neural-network ops: softmax, the normalizations (layer, batch, group), losses, embedding
and embedding_bag, dropout and glu, forward and backward.

Reduced-precision floats (bf16, f16) compute in float32, as torch's CPU and CUDA kernels
do (`at::opmath_type`); the executor casts results back to torch's result dtype. Ops with
an `output_mask` return None for every gradient the mask (or a missing weight/bias)
leaves out, exactly where torch's kernel returns an undefined tensor.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .pointwise import _promote
from .registry import aten, lowering

# at::Reduction
_NONE, _MEAN, _SUM = 0, 1, 2


def _opmath(x):
    """x in the dtype torch computes with: float32 for bf16 and f16 (at::opmath_type)."""
    if x is not None and x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return x


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _reduced_grad(grad_output, like, reduction):
    """grad_output of a reduced loss, spread back over the elements of `like`."""
    g = _opmath(grad_output)
    if reduction == _MEAN:
        g = g / like.size
    return jnp.broadcast_to(g, like.shape)


# ---------------------------------------------------------------- softmax
def _vectors(*xs):
    """torch accepts dim 0 / -1 on a 0-dim tensor and treats it as a 1-element vector."""
    return [x.reshape(1) if x.ndim == 0 else x for x in xs]


@lowering(aten._softmax.default)
def _softmax(self, dim, half_to_float):
    (x,) = _vectors(_opmath(self))
    return jax.nn.softmax(x, axis=dim).reshape(self.shape)


@lowering(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
    (x,) = _vectors(_opmath(self))
    return jax.nn.log_softmax(x, axis=dim).reshape(self.shape)


@lowering(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
    # softmax, but a row that is entirely -inf (a fully masked attention row) gives zeros
    # instead of NaN, as torch's SDPA math path needs
    (x,) = _vectors(_opmath(self))
    masked = jnp.all(x == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(masked, 0.0, jax.nn.softmax(x, axis=dim)).reshape(self.shape)


@lowering(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _vectors(_opmath(grad_output), _opmath(output))
    return (y * (g - jnp.sum(g * y, axis=dim, keepdims=True))).reshape(output.shape)


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _vectors(_opmath(grad_output), _opmath(output))
    return (g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)).reshape(output.shape)


# ---------------------------------------------------------------- normalization
def _normalized_input_grad(dxhat, xhat, rstd, axes):
    """d loss / d x for xhat = (x - mean(x)) * rstd over `axes`, given d loss / d xhat: the
    one formula behind layer, batch (training) and group norm backward."""
    return rstd * (dxhat - jnp.mean(dxhat, axis=axes, keepdims=True)
                   - xhat * jnp.mean(dxhat * xhat, axis=axes, keepdims=True))


def _moments(x, axes):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)  # biased, as torch normalizes
    return mean, var


def _weight_norm(v, g, dim):
    """nn.utils.weight_norm: w = v * g / |v|, the norm over every dim but `dim` (all of
    them for dim=-1), kept with size 1 so that it broadcasts."""
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim) if dim != -1 else tuple(range(v.ndim))
    norm = jnp.sqrt(jnp.sum(jnp.square(v.astype(jnp.float32)), axis=axes, keepdims=True))
    return (v * (g / norm).astype(v.dtype)).astype(v.dtype), norm.astype(g.dtype)


@lowering(aten._weight_norm_interface.default)
def _weight_norm_interface(v, g, dim=0):
    return _weight_norm(v, g, dim)


@lowering(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    _, vjp = jax.vjp(lambda v, g: _weight_norm(v, g, dim)[0], saved_v, saved_g)
    return vjp(grad_w)


@lowering(aten.native_layer_norm.default)
def _native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = _opmath(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * _opmath(weight)
    if bias is not None:
        out = out + _opmath(bias)
    return out, mean, rstd


@lowering(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                output_mask):
    g, x = _opmath(grad_out), _opmath(input)
    axis = x.ndim - len(normalized_shape)
    inner = tuple(range(axis, x.ndim))
    outer = tuple(range(axis))
    mean = mean.reshape(mean.shape + (1,) * (x.ndim - mean.ndim))
    rstd = rstd.reshape(rstd.shape + (1,) * (x.ndim - rstd.ndim))
    xhat = (x - mean) * rstd
    dxhat = g * _opmath(weight) if weight is not None else g
    grad_input = _normalized_input_grad(dxhat, xhat, rstd, inner) if output_mask[0] else None
    grad_weight = jnp.sum(g * xhat, axis=outer) if output_mask[1] and weight is not None else None
    grad_bias = jnp.sum(g, axis=outer) if output_mask[2] and bias is not None else None
    return grad_input, grad_weight, grad_bias


def _channel(v, ndim):
    """A per-channel vector (C,) shaped to broadcast against (N, C, *spatial)."""
    return _opmath(v).reshape((-1,) + (1,) * (ndim - 2))


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """-> (out, save_mean, save_invstd, new_running_mean, new_running_var); running stats
    are None when absent."""
    x = _opmath(input)
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        mean, var = _moments(x, axes)
        mean, var = mean.reshape(-1), var.reshape(-1)
        if running_mean is not None:
            n = x.size // x.shape[1]
            # torch tracks the unbiased variance in running_var
            unbiased = var * (n / max(n - 1, 1))
            running_mean = (1 - momentum) * _opmath(running_mean) + momentum * mean
            running_var = (1 - momentum) * _opmath(running_var) + momentum * unbiased
    else:
        mean, var = _opmath(running_mean), _opmath(running_var)
    invstd = lax.rsqrt(var + eps)
    out = (x - _channel(mean, x.ndim)) * _channel(invstd, x.ndim)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out, mean, invstd, running_mean, running_var


# native_batch_norm's schema does not mark running_mean/var as mutated although it updates
# them, so it is routed to these correctly-annotated ops (torch's own
# native_batch_norm_decomposition), never lowered itself.
@lowering(aten._native_batch_norm_legit.default)
def _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                             momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                         momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
                                        training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten.native_batch_norm_backward.default)
def _native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                                save_invstd, train, eps, output_mask):
    g, x = _opmath(grad_out), _opmath(input)
    axes = (0,) + tuple(range(2, x.ndim))
    if train:
        mean, invstd = _opmath(save_mean), _opmath(save_invstd)
    else:
        mean, invstd = _opmath(running_mean), lax.rsqrt(_opmath(running_var) + eps)
    mean, invstd = _channel(mean, x.ndim), _channel(invstd, x.ndim)
    w = _channel(weight, x.ndim) if weight is not None else 1.0
    xhat = (x - mean) * invstd
    grad_input = None
    if output_mask[0]:
        if train:
            grad_input = _normalized_input_grad(g * w, xhat, invstd, axes)
        else:  # the statistics are constants in eval mode
            grad_input = g * w * invstd
    grad_weight = jnp.sum(g * xhat, axis=axes) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=axes) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


@lowering(aten._batch_norm_with_update.default, aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, running_mean, running_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    # the empty reserve buffer stands where cudnn keeps its workspace
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), running_mean, running_var


@lowering(aten.batch_norm_backward.default)
def _batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                         update, eps, output_mask, reserve):
    # save_var holds the inverse std, as native_batch_norm's save_invstd
    return _native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
                                       save_mean, save_var, update, eps, output_mask)


def _grouped(x, n, group):
    """(N, C, *spatial) -> (N, group, C // group * HxW): the axes group norm reduces over.
    Sizes spelled out: -1 is ambiguous for an empty batch."""
    return x.reshape(n, group, math.prod(x.shape[1:]) // group)


@lowering(aten.native_group_norm.default)
def _native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = _opmath(input)
    xg = _grouped(x, N, group)
    mean, var = _moments(xg, (2,))
    rstd = lax.rsqrt(var + eps)
    out = ((xg - mean) * rstd).reshape(N, C, HxW)
    if weight is not None:
        out = out * _opmath(weight)[:, None]
    if bias is not None:
        out = out + _opmath(bias)[:, None]
    return out.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lowering(aten.native_group_norm_backward.default)
def _native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                output_mask):
    g = _opmath(grad_out).reshape(N, C, HxW)
    x = _opmath(input).reshape(N, C, HxW)
    mean = _opmath(mean).reshape(N, group, 1)
    rstd = _opmath(rstd).reshape(N, group, 1)
    xhat = ((_grouped(x, N, group) - mean) * rstd).reshape(N, C, HxW)
    grad_input = None
    if output_mask[0]:
        dxhat = g * _opmath(weight)[:, None] if weight is not None else g
        grad_input = _normalized_input_grad(
            _grouped(dxhat, N, group), _grouped(xhat, N, group), rstd, (2,))
        grad_input = grad_input.reshape(input.shape)
    grad_weight = jnp.sum(g * xhat, axis=(0, 2)) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=(0, 2)) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


# ---------------------------------------------------------------- classification losses
def _class_axis(x):
    # nll_loss takes (C,), (N, C) or (N, C, d1, ...): classes are dim 0 of a vector, else dim 1
    return 0 if x.ndim == 1 else 1


def _target_weights(target, weight, ignore_index):
    """Per-target weight: weight[target] (1 without weights), 0 where target == ignore_index."""
    ignored = target == ignore_index
    safe = jnp.where(ignored, 0, target)
    w = jnp.ones(target.shape, jnp.float32) if weight is None else _opmath(weight)[safe]
    return jnp.where(ignored, 0, w), safe


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss_forward(self, target, weight, reduction, ignore_index):
    x = _opmath(self)
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
def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    axis = _class_axis(self)
    w, safe = _target_weights(target, weight, ignore_index)
    g = _opmath(grad_output)
    if reduction == _MEAN:
        g = g / _opmath(total_weight)
    classes = lax.broadcasted_iota(safe.dtype, self.shape, axis)
    hit = classes == jnp.expand_dims(safe, axis)
    return jnp.where(hit, jnp.expand_dims(-w * g, axis), 0.0)


@lowering(aten.binary_cross_entropy.default)
def _binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = _opmath(self), _opmath(target)
    # torch clamps the logs at -100 so that x = 0 or 1 gives a finite loss
    loss = -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * _opmath(weight)
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = _opmath(self), _opmath(target)
    g = _reduced_grad(grad_output, x, reduction)
    grad = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)  # torch's EPSILON
    if weight is not None:
        grad = grad * _opmath(weight)
    return grad


@lowering(aten.binary_cross_entropy_with_logits.default)
def _binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None,
                                      reduction=_MEAN):
    x, t = _opmath(self), _opmath(target)
    log_sig = jax.nn.log_sigmoid(x)
    if pos_weight is not None:
        loss = (1 - t) * x - ((_opmath(pos_weight) - 1) * t + 1) * log_sig
    else:
        loss = (1 - t) * x - log_sig
    if weight is not None:
        loss = loss * _opmath(weight)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------- margin losses
def _frames(x):
    """A (C,), (N, C) or 0-dim input as (N, C) frames: torch's nframe and dim."""
    return x.reshape(1 if x.ndim <= 1 else x.shape[0], 1 if x.ndim == 0 else x.shape[-1])


@lowering(aten.multi_margin_loss.default)
def _multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    """sum over i != y of max(0, margin - x[y] + x[i])^p * weight[y], over C; the `where`
    makes the gradient 0 at z == 0, as torch's `z > 0` test does."""
    x = _frames(_opmath(self))
    t = target.reshape(-1)
    z = margin - jnp.take_along_axis(x, t[:, None], axis=1) + x
    h = jnp.where(p == 1, z, z * z)
    if weight is not None:
        h = h * _opmath(weight)[t][:, None]
    others = jnp.arange(x.shape[1]) != t[:, None]
    return _reduce(jnp.sum(jnp.where(others & (z > 0), h, 0), axis=1) / x.shape[1], reduction)


@lowering(aten.multi_margin_loss_backward.default)
def _multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None,
                                reduction=_MEAN):
    out, vjp = jax.vjp(lambda x: _multi_margin_loss(x, target, p, margin, weight, reduction),
                       _opmath(self))
    return vjp(_opmath(grad_output).reshape(out.shape))[0]


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
    x = _frames(_opmath(x))
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
    out, vjp = jax.vjp(lambda x: _multilabel_margin(x, target, reduction)[0], _opmath(self))
    return vjp(_opmath(grad_output).reshape(out.shape))[0]


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
    lp = jnp.swapaxes(_opmath(log_probs), 0, 1)
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
    both = _opmath(log_alpha) + beta  # (N, T, S)
    mine = labels[:, None, :, None] == jnp.arange(lp.shape[2])  # (N, 1, S, C)
    terms = jnp.where(mine, both[..., None], -jnp.inf)
    m = jnp.max(terms, axis=2)
    m = jnp.where(m == -jnp.inf, 0, m)
    lcab = jnp.log(jnp.sum(jnp.exp(terms - m[:, :, None]), axis=2)) + m  # (N, T, C)
    nll = _opmath(neg_log_likelihood)[:, None, None]
    g = (jnp.exp(lp) - jnp.exp(lcab + nll - lp)) * _opmath(grad)[:, None, None]
    active = np.arange(lp.shape[1]) < np.asarray(input_lengths)[:, None]
    g = jnp.where(active[..., None], g, 0)
    if zero_infinity:
        g = jnp.where(jnp.isinf(nll), 0, g)
    return jnp.swapaxes(g, 0, 1)


# ---------------------------------------------------------------- regression losses
def _diff(self, target):
    a, b = _promote(self, target)
    return _opmath(a) - _opmath(b)


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


# ---------------------------------------------------------------- embedding
@lowering(aten.embedding.default)
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default)
def _embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad_output.shape[-1]
    g = _opmath(grad_output).reshape(-1, dim)
    idx = indices.reshape(-1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    if padding_idx != -1:  # torch's "no padding" value; any other index gets no gradient
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    return jnp.zeros((num_weights, dim), g.dtype).at[idx].add(g)


# ---------------------------------------------------------------- embedding_bag
_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bag_of(indices, offsets):
    """The bag of each index position: bag b holds indices[offsets[b]:offsets[b + 1]]. With
    include_last_offset the positions past offsets[-1] get bag num_bags, which the
    segment ops drop."""
    pos = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    return jnp.searchsorted(offsets, pos, side="right").astype(indices.dtype) - 1


def _bag_rows(grad, bag):
    # positions in no bag (past offsets[-1]) read 0
    return jnp.take(_opmath(grad), bag, axis=0, mode="fill", fill_value=0)


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=_BAG_SUM,
                   sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=-1):
    """-> (output, offset2bag, bag_size, max_indices), the auxiliary results laid out as
    torch's meta kernel (and CUDA) has them: offset2bag per index, bag_size per offset,
    max_indices only for mode max (-1 for an empty bag)."""
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag = _bag_of(indices, offsets)
    counted = indices != padding_idx  # padding_idx entries belong to no bag's result
    rows = _opmath(jnp.take(weight, indices, axis=0))
    bag_size = jax.ops.segment_sum(counted.astype(indices.dtype), bag, num_bags)
    filled = (bag_size > 0)[:, None]
    if mode == _BAG_MAX:
        vals = jnp.where(counted[:, None], rows, -jnp.inf)
        best = jax.ops.segment_max(vals, bag, num_bags)
        # the first position holding the maximum, as torch's strict `>` scan keeps
        pos = jnp.arange(indices.shape[0])[:, None]
        hit = vals == jnp.take(best, bag, axis=0, mode="fill", fill_value=jnp.nan)
        first = jax.ops.segment_min(jnp.where(hit, pos, indices.shape[0]), bag, num_bags)
        max_indices = jnp.where(filled, jnp.take(indices, first, mode="clip"), -1)
        out = jnp.where(filled, best, 0)
    else:
        if per_sample_weights is not None:
            rows = rows * _opmath(per_sample_weights)[:, None]
        out = jax.ops.segment_sum(jnp.where(counted[:, None], rows, 0), bag, num_bags)
        if mode == _BAG_MEAN:
            out = out / jnp.maximum(bag_size, 1)[:, None]
        max_indices = jnp.zeros((0,), indices.dtype)
    bag_size = jnp.pad(bag_size, (0, offsets.shape[0] - num_bags))
    return out, bag, bag_size, max_indices


@lowering(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                  padding_idx=-1):
    g = _opmath(grad)
    dim = g.shape[1]
    if mode == _BAG_MAX:
        # each bag's gradient goes to the row that gave its maximum; empty bags (-1) drop
        rows = jnp.where(maximum_indices >= 0, maximum_indices, num_weights)
        return jnp.zeros((num_weights, dim), g.dtype).at[rows, jnp.arange(dim)].add(
            g, mode="drop")
    rows = _bag_rows(g, offset2bag)
    if mode == _BAG_MEAN:
        rows = rows / jnp.maximum(jnp.take(bag_size, offset2bag, mode="clip"), 1)[:, None]
    if per_sample_weights is not None:
        rows = rows * _opmath(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    rows = jnp.where((indices == padding_idx)[:, None], 0, rows)
    return jnp.zeros((num_weights, dim), g.dtype).at[indices].add(rows)


@lowering(aten._embedding_bag_backward.default)
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                            num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
                            padding_idx=-1):
    # the dense gradient whatever `sparse` says: the tpu has no sparse tensors
    return _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                         num_weights, scale_grad_by_freq, mode,
                                         per_sample_weights, padding_idx)


@lowering(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                               padding_idx=-1):
    dots = jnp.sum(_bag_rows(grad, offset2bag) * _opmath(jnp.take(weight, indices, axis=0)),
                   axis=1)
    return jnp.where(indices == padding_idx, 0, dots)


# ---------------------------------------------------------------- dropout, glu
@lowering(aten.native_dropout.default)
def _native_dropout(input, p, train, *, generator):
    if train is False:  # train=None means training, as in torch
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(generator, 1.0 - p, input.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    # scale in float32, not rounded to bf16 first: torch multiplies in opmath
    return _opmath(input) * keep * scale, keep


@lowering(aten.native_dropout_backward.default)
def _native_dropout_backward(grad_output, mask, scale):
    return _opmath(grad_output) * mask * scale


@lowering(aten.glu.default)
def _glu(self, dim=-1):
    a, b = jnp.split(_opmath(self), 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lowering(aten.glu_backward.default)
def _glu_backward(grad_output, self, dim):
    a, b = jnp.split(_opmath(self), 2, axis=dim)
    g = _opmath(grad_output)
    s = jax.nn.sigmoid(b)
    return jnp.concatenate([g * s, g * a * s * (1 - s)], axis=dim)



# ---------------------------------------------------------------- fused RNN cells
# nn.LSTM/GRU (and their cells) on a device other than CPU reach these fused cells, as on
# CUDA. The workspace holds what the backward needs; its layout is this file's own (the
# meta kernels fix only its size: 4H for LSTM, 5H for GRU).
def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    return input_gates, hidden_gates


@lowering(aten._thnn_fused_lstm_cell.default)
def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gi, gh = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = jnp.split(gi + gh, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default)
def _fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(workspace, 4, axis=1)
    tanh_cy = jnp.tanh(cy)
    d_cy = jnp.zeros_like(cy) if grad_cy is None else grad_cy
    d_o = jnp.zeros_like(cy)
    if grad_hy is not None:
        d_cy = d_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
        d_o = grad_hy * tanh_cy
    grad_gates = jnp.concatenate([d_cy * g * i * (1 - i), d_cy * cx * f * (1 - f),
                                  d_cy * i * (1 - g * g), d_o * o * (1 - o)], axis=1)
    grad_bias = jnp.sum(grad_gates, axis=0) if has_bias else None
    return grad_gates, d_cy * f, grad_bias


@lowering(aten._thnn_fused_gru_cell.default)
def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    gi, gh = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    i_r, i_z, i_n = jnp.split(gi, 3, axis=1)
    h_r, h_z, h_n = jnp.split(gh, 3, axis=1)
    r = jax.nn.sigmoid(i_r + h_r)
    z = jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    hy = (1 - z) * n + z * hx
    return hy, jnp.concatenate([r, z, n, hx, h_n], axis=1)


@lowering(aten._thnn_fused_gru_cell_backward.default)
def _fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, h_n = jnp.split(workspace, 5, axis=1)
    d_n = grad_hy * (1 - z) * (1 - n * n)
    d_z = grad_hy * (hx - n) * z * (1 - z)
    d_r = d_n * h_n * r * (1 - r)
    grad_input = jnp.concatenate([d_r, d_z, d_n], axis=1)
    grad_hidden = jnp.concatenate([d_r, d_z, d_n * r], axis=1)
    # without biases torch returns undefined tensors, which autograd drops; zeros do too
    sum0 = (lambda g: jnp.sum(g, axis=0)) if has_bias else (lambda g: jnp.zeros(g.shape[1:], g.dtype))
    return grad_input, grad_hidden, grad_hy * z, sum0(grad_input), sum0(grad_hidden)
