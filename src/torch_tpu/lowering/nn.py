"""Neural-network ops: softmax, the normalizations (layer, batch, group), embedding and
embedding_bag, dropout and glu, and the fused RNN cells, forward and backward (the losses
are in loss.py).

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

from . import bounds
from ._dtypes import to_opmath
from .registry import aten, index_bounds, lowering


# ---------------------------------------------------------------- softmax
def _vectors(*xs):
    """torch accepts dim 0 / -1 on a 0-dim tensor and treats it as a 1-element vector."""
    return [x.reshape(1) if x.ndim == 0 else x for x in xs]


@lowering(aten._softmax.default)
def _softmax(self, dim, half_to_float):
    (x,) = _vectors(to_opmath(self))
    return jax.nn.softmax(x, axis=dim).reshape(self.shape)


@lowering(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
    (x,) = _vectors(to_opmath(self))
    return jax.nn.log_softmax(x, axis=dim).reshape(self.shape)


@lowering(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
    # softmax, but a row that is entirely -inf (a fully masked attention row) gives zeros
    # instead of NaN, as torch's SDPA math path needs
    (x,) = _vectors(to_opmath(self))
    masked = jnp.all(x == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(masked, 0.0, jax.nn.softmax(x, axis=dim)).reshape(self.shape)


@lowering(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _vectors(to_opmath(grad_output), to_opmath(output))
    return (y * (g - jnp.sum(g * y, axis=dim, keepdims=True))).reshape(output.shape)


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _vectors(to_opmath(grad_output), to_opmath(output))
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
    x = to_opmath(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * to_opmath(weight)
    if bias is not None:
        out = out + to_opmath(bias)
    return out, mean, rstd


@lowering(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                output_mask):
    g, x = to_opmath(grad_out), to_opmath(input)
    axis = x.ndim - len(normalized_shape)
    inner = tuple(range(axis, x.ndim))
    outer = tuple(range(axis))
    mean = mean.reshape(mean.shape + (1,) * (x.ndim - mean.ndim))
    rstd = rstd.reshape(rstd.shape + (1,) * (x.ndim - rstd.ndim))
    xhat = (x - mean) * rstd
    dxhat = g * to_opmath(weight) if weight is not None else g
    grad_input = _normalized_input_grad(dxhat, xhat, rstd, inner) if output_mask[0] else None
    grad_weight = jnp.sum(g * xhat, axis=outer) if output_mask[1] and weight is not None else None
    grad_bias = jnp.sum(g, axis=outer) if output_mask[2] and bias is not None else None
    return grad_input, grad_weight, grad_bias


def _channel(v, ndim):
    """A per-channel vector (C,) shaped to broadcast against (N, C, *spatial)."""
    return to_opmath(v).reshape((-1,) + (1,) * (ndim - 2))


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """-> (out, save_mean, save_invstd, new_running_mean, new_running_var); running stats
    are None when absent."""
    x = to_opmath(input)
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        mean, var = _moments(x, axes)
        mean, var = mean.reshape(-1), var.reshape(-1)
        if running_mean is not None:
            n = x.size // x.shape[1]
            # torch tracks the unbiased variance in running_var
            unbiased = var * (n / max(n - 1, 1))
            running_mean = (1 - momentum) * to_opmath(running_mean) + momentum * mean
            running_var = (1 - momentum) * to_opmath(running_var) + momentum * unbiased
    else:
        mean, var = to_opmath(running_mean), to_opmath(running_var)
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
    g, x = to_opmath(grad_out), to_opmath(input)
    axes = (0,) + tuple(range(2, x.ndim))
    if train:
        mean, invstd = to_opmath(save_mean), to_opmath(save_invstd)
    else:
        mean, invstd = to_opmath(running_mean), lax.rsqrt(to_opmath(running_var) + eps)
    mean, invstd = _channel(mean, x.ndim), _channel(invstd, x.ndim)
    w = _channel(weight, x.ndim) if weight is not None else 1.0
    xhat = (x - mean) * invstd
    # the input's gradient even where output_mask leaves it out, as torch's decomposition
    # (the meta the result specs come from) returns it: a batch norm on the inputs
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
    x = to_opmath(input)
    xg = _grouped(x, N, group)
    mean, var = _moments(xg, (2,))
    rstd = lax.rsqrt(var + eps)
    out = ((xg - mean) * rstd).reshape(N, C, HxW)
    if weight is not None:
        out = out * to_opmath(weight)[:, None]
    if bias is not None:
        out = out + to_opmath(bias)[:, None]
    return out.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lowering(aten.native_group_norm_backward.default)
def _native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                output_mask):
    g = to_opmath(grad_out).reshape(N, C, HxW)
    x = to_opmath(input).reshape(N, C, HxW)
    mean = to_opmath(mean).reshape(N, group, 1)
    rstd = to_opmath(rstd).reshape(N, group, 1)
    xhat = ((_grouped(x, N, group) - mean) * rstd).reshape(N, C, HxW)
    grad_input = None
    if output_mask[0]:
        dxhat = g * to_opmath(weight)[:, None] if weight is not None else g
        grad_input = _normalized_input_grad(
            _grouped(dxhat, N, group), _grouped(xhat, N, group), rstd, (2,))
        grad_input = grad_input.reshape(input.shape)
    grad_weight = jnp.sum(g * xhat, axis=(0, 2)) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=(0, 2)) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


# ---------------------------------------------------------------- embedding
@lowering(aten.embedding.default)
@index_bounds(bounds.rows(0, 1))
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default)
@index_bounds(bounds.rows(None, 1, rows_i=2))
def _embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad_output.shape[-1]
    g = to_opmath(grad_output).reshape(-1, dim)
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
    return jnp.take(to_opmath(grad), bag, axis=0, mode="fill", fill_value=0)


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
@index_bounds(bounds.rows(0, 1))
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=_BAG_SUM,
                   sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=-1):
    """-> (output, offset2bag, bag_size, max_indices), the auxiliary results laid out as
    torch's meta kernel (and CUDA) has them: offset2bag per index, bag_size per offset,
    max_indices only for mode max (-1 for an empty bag)."""
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag = _bag_of(indices, offsets)
    counted = indices != padding_idx  # padding_idx entries belong to no bag's result
    rows = to_opmath(jnp.take(weight, indices, axis=0))
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
            rows = rows * to_opmath(per_sample_weights)[:, None]
        out = jax.ops.segment_sum(jnp.where(counted[:, None], rows, 0), bag, num_bags)
        if mode == _BAG_MEAN:
            out = out / jnp.maximum(bag_size, 1)[:, None]
        max_indices = jnp.zeros((0,), indices.dtype)
    bag_size = jnp.pad(bag_size, (0, offsets.shape[0] - num_bags))
    return out, bag, bag_size, max_indices


@lowering(aten._embedding_bag_dense_backward.default)
@index_bounds(bounds.rows(None, 1, rows_i=5))
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                  padding_idx=-1):
    g = to_opmath(grad)
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
        rows = rows * to_opmath(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    rows = jnp.where((indices == padding_idx)[:, None], 0, rows)
    return jnp.zeros((num_weights, dim), g.dtype).at[indices].add(rows)


@lowering(aten._embedding_bag_backward.default)
@index_bounds(bounds.rows(None, 1, rows_i=6))
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
    dots = jnp.sum(_bag_rows(grad, offset2bag) * to_opmath(jnp.take(weight, indices, axis=0)),
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
    return to_opmath(input) * keep * scale, keep


@lowering(aten.native_dropout_backward.default)
def _native_dropout_backward(grad_output, mask, scale):
    return to_opmath(grad_output) * mask * scale


@lowering(aten.glu.default)
def _glu(self, dim=-1):
    a, b = jnp.split(to_opmath(self), 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lowering(aten.glu_backward.default)
def _glu_backward(grad_output, self, dim):
    a, b = jnp.split(to_opmath(self), 2, axis=dim)
    g = to_opmath(grad_output)
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
