"""Activation functions and the backward ops autograd calls for them.

Formulas follow torch's CPU kernels (aten/src/ATen/native/cpu/Activation.cpp), computed
in opmath (float32 for 16-bit floats) like they are. Scalar parameters (alpha, slope,
beta, ...) are converted straight to that dtype, as torch does. A backward op takes the
forward's input (or output, where torch saves that) and the incoming gradient.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ._dtypes import cast_operands, opmath_dtype, pointwise, round_to, scalar_like
from .registry import aten, lowering

_SQRT1_2 = math.sqrt(0.5)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_TANH_BETA = math.sqrt(2 / math.pi)
_TANH_KAPPA = 0.044715


def _sigmoid(x):
    return 1 / (1 + jnp.exp(-x))


def _softplus(x):
    return jnp.log1p(jnp.exp(x))


def _zero(x):
    return jnp.zeros_like(x)


# ---------------------------------------------------------------- relu family
@pointwise(aten.relu.default)
def _relu(x):
    return jnp.maximum(x, 0)  # NaN stays NaN, as torch's clamp_min(x, 0)


@pointwise(aten.threshold.default)
def _threshold(x, threshold, value):
    return jnp.where(x <= scalar_like(threshold, x), scalar_like(value, x), x)


@pointwise(aten.threshold_backward.default, operands=2)
def _threshold_backward(grad, x, threshold):
    return jnp.where(x <= scalar_like(threshold, x), _zero(grad), grad)


@pointwise(aten.hardtanh.default)
def _hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, scalar_like(min_val, x)), scalar_like(max_val, x))


@pointwise(aten.hardtanh_backward.default, operands=2)
def _hardtanh_backward(grad, x, min_val, max_val):
    outside = (x <= scalar_like(min_val, x)) | (x >= scalar_like(max_val, x))
    return jnp.where(outside, _zero(grad), grad)


@pointwise(aten.leaky_relu.default)
def _leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * scalar_like(negative_slope, x))


@pointwise(aten.leaky_relu_backward.default, operands=2)
def _leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * scalar_like(negative_slope, grad))


@lowering(aten.rrelu_with_noise.default, aten.rrelu_with_noise_functional.default)
def _rrelu_with_noise(self, noise, lower=0.125, upper=1 / 3, training=False, _torch_generator=None,
                      *, generator):
    """-> (result, new noise). Training draws the slope of every non-positive element from
    U(lower, upper) and records it in noise (1 elsewhere), as torch's CPU kernel; eval is
    leaky_relu with the mean slope and leaves noise alone. (The schema's positional
    Generator arrives as None; the key comes as `generator=`.)"""
    x = self.astype(opmath_dtype(self.dtype))
    if not training:
        return jnp.where(x > 0, x, x * scalar_like((lower + upper) / 2, x)), noise
    slope = jax.random.uniform(generator, x.shape, x.dtype, lower, upper)
    negative = x <= 0
    return jnp.where(negative, x * slope, x), jnp.where(negative, slope, 1)


@lowering(aten.rrelu_with_noise_backward.default)
def _rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    grad, x = cast_operands(grad_output, self)
    # torch uses the recorded slopes only when the range is not a single value
    mean_slope = jnp.where(x > 0, grad, grad * scalar_like((lower + upper) / 2, grad))
    if not training:
        return mean_slope
    return jnp.where(upper - lower > 1e-6, grad * noise, mean_slope)


@pointwise(aten._prelu_kernel.default, operands=2)
def _prelu(x, weight):
    return jnp.where(x > 0, x, weight * x)


@lowering(aten._prelu_kernel_backward.default)
def _prelu_backward(grad_output, self, weight):
    grad, x, w = cast_operands(grad_output, self, weight)
    # the weight gradient comes back at the broadcast shape; autograd sums it to weight's
    return jnp.where(x > 0, grad, w * grad), jnp.where(x > 0, _zero(x), x * grad)


# ---------------------------------------------------------------- smooth activations
@pointwise(aten.gelu.default)
def _gelu(x, *, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_TANH_BETA * (x + _TANH_KAPPA * x * x * x)))
    return x * 0.5 * (1 + lax.erf(x * _SQRT1_2))


@pointwise(aten.gelu_backward.default, operands=2)
def _gelu_backward(grad, x, *, approximate="none"):
    if approximate == "tanh":
        inner = _TANH_BETA * (x + _TANH_KAPPA * x * x * x)
        t = jnp.tanh(inner)
        left = 0.5 * (1 + t)
        right = 0.5 * x * (1 - t * t) * _TANH_BETA * (1 + 3 * _TANH_KAPPA * x * x)
        return grad * (left + right)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return grad * (cdf + x * pdf)


@pointwise(aten.silu.default)
def _silu(x):
    return x / (1 + jnp.exp(-x))


@pointwise(aten.silu_backward.default, operands=2)
def _silu_backward(grad, x):
    s = _sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@pointwise(aten.mish.default)
def _mish(x):
    return x * jnp.tanh(_softplus(x))


@pointwise(aten.mish_backward.default, operands=2)
def _mish_backward(grad, x):
    t = jnp.tanh(_softplus(x))
    return grad * (t + x * _sigmoid(x) * (1 - t * t))


@pointwise(aten.sigmoid_backward.default, operands=2)
def _sigmoid_backward(grad, out):
    return grad * (1 - out) * out


@pointwise(aten.tanh_backward.default, operands=2)
def _tanh_backward(grad, out):
    return grad * (1 - out * out)


@pointwise(aten.elu.default)
def _elu(x, alpha=1, scale=1, input_scale=1):
    negative = (jnp.expm1(x * scalar_like(input_scale, x)) * scalar_like(alpha, x)
                * scalar_like(scale, x))
    return jnp.where(x > 0, x * scalar_like(scale, x), negative)


@lowering(aten.elu_backward.default)
def _elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    grad, y = cast_operands(grad_output, self_or_result)
    neg_coef = scalar_like(alpha, y) * scalar_like(scale, y)
    in_coef = scalar_like(input_scale, y)
    if is_result:  # y = elu(x): for x <= 0, d/dx = input_scale * (y + alpha * scale)
        negative = grad * in_coef * (y + neg_coef)
    else:
        negative = grad * in_coef * neg_coef * jnp.exp(y * in_coef)
    return jnp.where(y <= 0, negative, grad * scalar_like(scale, y))


@pointwise(aten.softplus.default)
def _softplus_lowering(x, beta=1, threshold=20):
    bx = x * scalar_like(beta, x)
    return jnp.where(bx > scalar_like(threshold, x), x,
                     jnp.log1p(jnp.exp(bx)) / scalar_like(beta, x))


@pointwise(aten.softplus_backward.default, operands=2)
def _softplus_backward(grad, x, beta, threshold):
    bx = x * scalar_like(beta, x)
    z = jnp.exp(bx)
    return jnp.where(bx > scalar_like(threshold, x), grad, grad * z / (z + 1))


@pointwise(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(x):
    out = jnp.minimum(x, 0) - jnp.log1p(jnp.exp(-jnp.abs(x)))
    # `buffer` only serves torch's CPU backward; ours recomputes from the input
    return out, jnp.zeros((), x.dtype)


@pointwise(aten.log_sigmoid_backward.default, operands=2)
def _log_sigmoid_backward(grad, x, buffer):
    return grad * _sigmoid(-x)


# ---------------------------------------------------------------- piecewise linear
@pointwise(aten.hardsigmoid.default)
def _hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


@pointwise(aten.hardsigmoid_backward.default, operands=2)
def _hardsigmoid_backward(grad, x):
    return jnp.where((x > -3) & (x < 3), grad / 6, _zero(grad))


@pointwise(aten.hardswish.default)
def _hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@pointwise(aten.hardswish_backward.default, operands=2)
def _hardswish_backward(grad, x):
    # torch takes the slopes of the outer pieces at the kinks: 0 at -3, 1 at 3
    middle = grad * (x / 3 + 0.5)
    return jnp.where(x <= -3, _zero(grad), jnp.where(x < 3, middle, grad))


@pointwise(aten.hardshrink.default)
def _hardshrink(x, lambd=0.5):
    lam = scalar_like(lambd, x)
    return jnp.where((x >= -lam) & (x <= lam), _zero(x), x)


@pointwise(aten.softshrink.default)
def _softshrink(x, lambd=0.5):
    lam = scalar_like(lambd, x)
    # x * 0 in the dead zone keeps NaN (and the sign of zero), as torch
    return jnp.where(x > lam, x - lam, jnp.where(x < -lam, x + lam, x * 0))


@pointwise(aten.hardshrink_backward.default, aten.softshrink_backward.default, operands=2)
def _shrink_backward(grad, x, lambd):
    lam = scalar_like(lambd, x)
    return jnp.where((x >= -lam) & (x <= lam), _zero(grad), grad)


# ---------------------------------------------------------------- logit
@pointwise(aten.logit.default, int_to_float=True, opmath=False)
def _logit(x, eps=None):
    # torch clamps to [eps, 1 - eps] and forms x / (1 - x) in the input's own dtype; a
    # 16-bit ratio is rounded before the log, which changes the log near x = 0.5
    dtype = x.dtype
    if eps is not None and eps >= 0:  # torch ignores a negative eps
        lo = jnp.asarray(eps, dtype)
        x = jnp.clip(x, lo, 1 - lo)
    x = x.astype(opmath_dtype(dtype))
    return jnp.log(round_to(x / round_to(1 - x, dtype), dtype))


@pointwise(aten.logit_backward.default, operands=2, int_to_float=True)
def _logit_backward(grad, x, eps=None):
    dx = grad / (x * (1 - x))
    if eps is None or eps < 0:
        return jnp.where((x < 0) | (x > 1), jnp.nan, dx)
    return jnp.where((x < eps) | (x > 1 - eps), _zero(dx), dx)
