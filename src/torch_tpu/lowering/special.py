"""torch.special-style functions: the gamma family, zeta, Bessel, xlogy and friends.

JAX's jax.scipy.special covers these, but differs from torch at poles and outside the
series' domains; the wrappers here apply torch's rules (aten/src/ATen/native/Math.h).
All compute in floating point: int and bool inputs promote to the default dtype.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from .pointwise import _operands, pointwise
from .registry import aten, lowering


def _xlog(log):
    def fn(x, y):
        # torch: NaN if y is NaN, else 0 where x == 0 (even where log(y) is inf or NaN)
        out = jnp.where(x == 0, jnp.zeros_like(x), x * log(y))
        return jnp.where(jnp.isnan(y), y, out)

    return fn


def _zeta(x, q):
    """Hurwitz zeta with torch's domain rules (which JAX's zeta does not follow): inf at
    x == 1, NaN for x < 1, inf at the poles q = 0, -1, ..., NaN for other q <= 0 unless x
    is an integer."""
    x, q = jnp.broadcast_arrays(x, q)

    # JAX's series is only accurate for q > 0; like torch's loop, sum the leading terms
    # directly until q is past 1: zeta(x, q) = q ** -x + zeta(x, q + 1)
    def shift(carry):
        head, qk = carry
        move = (qk < 1) & jnp.isfinite(qk)
        return head + jnp.where(move, qk ** -x, 0), jnp.where(move, qk + 1, qk)

    head, qk = lax.while_loop(lambda c: jnp.any((c[1] < 1) & jnp.isfinite(c[1])), shift,
                              (jnp.zeros_like(q), q))
    out = head + jsp.zeta(x, qk)
    out = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, out)
    out = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, out)
    return jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, out))


def _digamma(x):
    # torch: digamma(+-0) = -+inf, NaN at the negative integers (the poles)
    pole = (x < 0) & (x == jnp.floor(x))
    out = jnp.where(pole, jnp.nan, jsp.digamma(x))
    return jnp.where(x == 0, jnp.copysign(jnp.full_like(x, jnp.inf), -x), out)


def _trigamma(x):
    """torch's calc_trigamma: reflection below 1/2, six recurrence steps, then the
    asymptotic series; JAX's polygamma(1, x) is wrong for x below about -5."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(jnp.pi * x)
    result = jnp.where(reflect, -(jnp.pi ** 2) / (sin_pi_x * sin_pi_x), 0.0)
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx / 42))) / x
    return jnp.where(reflect, -result, result)


def _entr(x):
    out = jnp.where(x == 0, jnp.zeros_like(x), -x * jnp.log(x))
    return jnp.where(x < 0, -jnp.inf, out)


@lowering(aten.polygamma.default)
def _polygamma(n, self):
    (x,) = _operands(self, int_to_float=True)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    # torch's formula, through the zeta with torch's pole rules (JAX's polygamma gives NaN
    # at the poles, where torch gives +-inf)
    return (-1.0) ** (n + 1) * math.factorial(n) * _zeta(jnp.asarray(n + 1.0, x.dtype), x)


@pointwise(aten.mvlgamma.default, int_to_float=True)
def _mvlgamma(x, p):
    return jsp.multigammaln(x, p)


_BINARY = [
    ([aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other], _xlog(jnp.log)),
    ([aten.special_xlog1py.default, aten.special_xlog1py.self_scalar,
      aten.special_xlog1py.other_scalar], _xlog(jnp.log1p)),
    ([aten.special_zeta.default, aten.special_zeta.self_scalar,
      aten.special_zeta.other_scalar], _zeta),
    ([aten.igamma.default], jsp.gammainc),
    ([aten.igammac.default], jsp.gammaincc),
]
for _ops, _fn in _BINARY:
    pointwise(*_ops, operands=2, int_to_float=True)(_fn)

_UNARY = {
    aten.lgamma.default: lax.lgamma,
    aten.digamma.default: _digamma,
    aten.i0.default: jsp.i0,
    aten.special_i0e.default: jsp.i0e,
    aten.special_i1.default: jsp.i1,
    aten.special_i1e.default: jsp.i1e,
    aten.special_ndtri.default: jsp.ndtri,
    aten.special_log_ndtr.default: jsp.log_ndtr,
    aten.special_erfcx.default: jsp.erfcx,
    aten.special_entr.default: _entr,
}
for _op, _fn in _UNARY.items():
    pointwise(_op, int_to_float=True)(_fn)
