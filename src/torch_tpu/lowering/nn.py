"""Neural-network ops: softmax, the normalizations (layer, batch, group), losses, embedding,
dropout and glu, forward and backward.

Reduced-precision floats (bf16, f16) compute in float32, as torch's CPU and CUDA kernels
do (`at::opmath_type`); the executor casts results back to torch's result dtype. Ops with
an `output_mask` return None for every gradient the mask (or a missing weight/bias)
leaves out, exactly where torch's kernel returns an undefined tensor.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
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

