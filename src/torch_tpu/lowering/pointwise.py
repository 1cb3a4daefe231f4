"""Elementwise ops: arithmetic, math functions, comparisons, bitwise and selection ops.

Type promotion and opmath are torch's, declared once by the `pointwise` factory of
_dtypes.py. Activations live in activation.py, gamma/zeta/Bessel-family functions in
special.py and the `_foreach_*` ops in foreach.py, all built on the same rules.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .. import _runtime
from ._dtypes import (cast_operands, is_inexact, pointwise, promote, result_dtype, round_to,
                      scalar_like, scalar_type_name)
from .registry import aten, keyed_scalars, lowering


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


# ---------------------------------------------------------------- arithmetic
def _add_or_sub(self, other, alpha, sign):
    a, b = cast_operands(self, other)
    if not (isinstance(alpha, int) and alpha == 1):
        # torch rounds alpha to the common dtype, then multiply-adds in opmath
        alpha = round_to(jnp.asarray(alpha).astype(a.dtype), result_dtype(self, other))
        b = alpha * b
    return a + b if sign > 0 else a - b


@lowering(aten.add.Tensor, aten.add.Scalar)
def _add(self, other, alpha=1):
    return _add_or_sub(self, other, alpha, 1)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def _sub(self, other, alpha=1):
    return _add_or_sub(self, other, alpha, -1)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(self, other, alpha=1):
    return _sub(other, self, alpha)  # torch computes rsub as sub(other, self)


@pointwise(aten.mul.Tensor, aten.mul.Scalar, operands=2, exact=(1,))
def _mul(a, b):
    return a * b


@pointwise(aten.div.Tensor, aten.div.Scalar, operands=2, int_to_float=True, exact=(1,))
def _true_div(a, b):
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    if jnp.shape(b) != shape and a.dtype == jnp.float32 and _runtime.platform() == "cpu":
        # torch's division is correctly rounded. XLA's algebraic simplifier turns
        # `a / broadcast(b)` into `a * (1 / b)`, one ulp off for about a quarter of the
        # elements (`x / 28` over a linspace); a model whose gradient jumps at pixel
        # centres (deformable attention's bilinear sampling, where GroundingDINO's
        # reference points `(i + 0.5) / W` lie) then differs from CPU by 1000x CPU's own
        # error. A barrier keeps the divisor a full-size operand, which XLA divides
        # exactly: 10M elements by a scalar or a column, 11.5-14.4 ms against 12.8-14.7
        # (an error-correcting step in float64 cost 16-20 ms). A divisor broadcast by an
        # earlier op of the same graph (`b.expand(...)` then `/`) still meets the rewrite.
        # On TPU division is approximate in hardware; XLA:GPU rewrites as XLA:CPU does,
        # unmeasured there, so only the CPU platform takes this.
        b = lax.optimization_barrier(jnp.broadcast_to(b, shape))
    return a / b


def _floor_div(a, b, dtype):
    """Python's floor division, as torch's div_floor_integer / div_floor_floating; float
    steps round to `dtype` where torch's do."""
    a, b = jnp.broadcast_arrays(a, b)  # lax ops do not broadcast
    if not is_inexact(a.dtype):
        q = lax.div(a, b)  # truncates
        return jnp.where((lax.rem(a, b) != 0) & ((a < 0) != (b < 0)), q - 1, q)
    mod = lax.rem(a, b)
    div = round_to(round_to(a - mod, dtype) / b, dtype)
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    result = jnp.where(div != 0, floor, jnp.copysign(jnp.zeros_like(div), a / b))
    return jnp.where(b == 0, a / b, result)  # torch gives IEEE inf/nan for x // 0.0


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return _true_div(self, other)
    dtype = result_dtype(self, other)
    a, b = cast_operands(self, other)
    if rounding_mode == "floor":
        return _floor_div(a, b, dtype)
    if not is_inexact(a.dtype):
        return lax.div(*jnp.broadcast_arrays(a, b))  # C integer division truncates
    return jnp.trunc(round_to(a / b, dtype))  # torch truncates the rounded quotient


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(self, other):
    return _div_mode(self, other, rounding_mode="floor")


@pointwise(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor,
           operands=2)
def _remainder(a, b):
    """Result has the divisor's sign (Python's %): C's fmod, shifted by b when signs differ."""
    mod = lax.rem(*jnp.broadcast_arrays(a, b))
    return jnp.where((mod != 0) & ((mod < 0) != (b < 0)), mod + b, mod)


@pointwise(aten.fmod.Tensor, aten.fmod.Scalar, operands=2)
def _fmod(a, b):
    # C's fmod and integer %: the result has the dividend's sign
    return lax.rem(*jnp.broadcast_arrays(a, b))


def _int_pow(base, exp):
    """torch's powi: square-and-multiply that wraps on overflow; a negative exponent gives
    1 for base 1, +-1 for base -1 and 0 otherwise (integer 1 / base**|e|)."""
    base, exp = jnp.broadcast_arrays(base, exp)

    def step(_, carry):
        acc, b, e = carry
        return jnp.where((e & 1) == 1, acc * b, acc), b * b, e >> 1

    bits = jnp.iinfo(exp.dtype).bits
    acc, _, _ = lax.fori_loop(0, bits, step, (jnp.ones_like(base), base, jnp.maximum(exp, 0)))
    if not jnp.issubdtype(exp.dtype, jnp.signedinteger):
        return acc
    one = jnp.ones_like(base)
    negative = jnp.where(base == 1, one,
                         jnp.where(base == -1, jnp.where(exp % 2 == 0, one, -one), 0 * one))
    return jnp.where(exp < 0, negative, acc)


# torch's kernel computes the common exponents as products and sqrt, exact (RMSNorm's
# x ** 2, and its gradient's x ** 1 and rsqrt's x ** 3, are in every layer)
_COMMON_POWERS = {2: lambda b: b * b, 3: lambda b: b * b * b, 0.5: jnp.sqrt, 1: lambda b: b}


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
@keyed_scalars("exponent")
def _pow(base, exp):
    # pow.Tensor_Scalar's exponent is SCALAR_KEYED: a common one comes as a Python number,
    # keying its own program (read before the operands are cast, which stages them)
    common = _COMMON_POWERS.get(exp) if type(exp) in (int, float) else None
    base, exp = cast_operands(base, exp)
    if base.dtype == jnp.bool_:
        return _int_pow(base.astype(jnp.int64), exp.astype(jnp.int64))
    if _is_int(base):
        return _int_pow(base, exp)
    if common is not None:
        return common(base)
    if jnp.ndim(exp) != 0:
        return lax.pow(*jnp.broadcast_arrays(base, exp))
    # A traced Scalar exponent (one program serves every value): XLA cannot specialize
    # x ** 2 itself, so a switch runs only the branch the exponent picks (a select would
    # compute the general pow of every element too, ~20 ns each on XLA:CPU).
    branches = [*_COMMON_POWERS.values(), lambda b: lax.pow(b, jnp.broadcast_to(exp, b.shape))]
    index = jnp.select([exp == v for v in _COMMON_POWERS], list(range(len(_COMMON_POWERS))),
                       len(_COMMON_POWERS))
    return lax.switch(index, branches, base)


@pointwise(aten.maximum.default, operands=2)
def _maximum(a, b):
    return jnp.maximum(a, b)  # propagates NaN, as torch


@pointwise(aten.minimum.default, operands=2)
def _minimum(a, b):
    return jnp.minimum(a, b)


@pointwise(aten.fmax.default, operands=2)
def _fmax(a, b):
    return jnp.fmax(a, b)  # ignores NaN


@pointwise(aten.fmin.default, operands=2)
def _fmin(a, b):
    return jnp.fmin(a, b)


# binary ops computing in floating point: int and bool operands promote to the default dtype
_FLOAT_BINARY = [
    ([aten.atan2.default], jnp.arctan2),
    ([aten.hypot.default], jnp.hypot),
    ([aten.copysign.Tensor, aten.copysign.Scalar], jnp.copysign),
    ([aten.logaddexp.default], jnp.logaddexp),
    ([aten.logaddexp2.default], jnp.logaddexp2),
    ([aten.ldexp.Tensor], lambda x, e: x * jnp.exp2(e)),
]
for _ops, _fn in _FLOAT_BINARY:
    pointwise(*_ops, operands=2, int_to_float=True)(_fn)


@pointwise(aten.nextafter.default, operands=2, opmath=False)
def _nextafter(a, b):
    return jnp.nextafter(a, b)  # steps on the operands' own grid, so no float32 opmath


@pointwise(aten.heaviside.default, operands=2)
def _heaviside(x, values):
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@pointwise(aten.gcd.default, operands=2)
def _gcd(a, b):
    return jnp.gcd(a, b)


@pointwise(aten.lcm.default, operands=2)
def _lcm(a, b):
    return jnp.lcm(a, b)


# ---------------------------------------------------------------- unary math
def _keep_ints(fn):
    """Rounding ops are the identity on integer and bool tensors."""
    return lambda x: fn(x) if is_inexact(x.dtype) else x


def _sign(x):
    if x.dtype == jnp.bool_:
        return x
    # torch computes (0 < x) - (x < 0): sign(NaN) and sign(-0.0) are +0
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _sgn(x):
    if not jnp.issubdtype(x.dtype, jnp.complexfloating):
        return _sign(x)
    mag = jnp.abs(x)
    return jnp.where(mag == 0, jnp.zeros_like(x), x / mag.astype(x.dtype))


def _angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.angle(x)
    # torch: pi for negative reals, 0 otherwise, NaN stays NaN
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


# int and bool inputs compute in the default float dtype (torch's INT_TO_FLOAT ops)
_FLOAT_UNARY = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.reciprocal.default: lambda x: 1 / x,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.sinc.default: jnp.sinc,
    aten.angle.default: _angle,
}
# the result keeps the input's dtype
_SAME_UNARY = {
    aten.abs.default: lambda x: x if x.dtype == jnp.bool_ else jnp.abs(x),
    aten.neg.default: jnp.negative,
    aten.sign.default: _sign,
    aten.sgn.default: _sgn,
    aten.floor.default: _keep_ints(jnp.floor),
    aten.ceil.default: _keep_ints(jnp.ceil),
    aten.trunc.default: _keep_ints(jnp.trunc),
    aten.round.default: _keep_ints(jnp.round),  # half to even, as torch's nearbyint
    aten.frac.default: lambda x: x - jnp.trunc(x),
    aten.bitwise_not.default: jnp.invert,
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isposinf.default: jnp.isposinf,
    aten.isneginf.default: jnp.isneginf,
    aten.logical_not.default: lambda x: x == 0,
}
for _op, _fn in _FLOAT_UNARY.items():
    pointwise(_op, int_to_float=True)(_fn)
for _op, _fn in _SAME_UNARY.items():
    pointwise(_op)(_fn)


@pointwise(aten.signbit.default, opmath=False)
def _signbit(x):
    return jnp.signbit(x) if is_inexact(x.dtype) else x < 0


@pointwise(aten.round.decimals)
def _round_decimals(x, *, decimals=0):
    if not is_inexact(x.dtype):
        return x
    scale = jnp.asarray(10.0 ** abs(decimals), x.dtype)
    if decimals >= 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / scale) * scale


@pointwise(aten.nan_to_num.default, opmath=False)
def _nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not is_inexact(x.dtype):
        return x
    # defaults are the largest finite values of the tensor's own dtype, hence no opmath
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowering(aten._efficientzerotensor.default)
def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """The gradient autograd knows to be zero (sgn, abs, ... of a real tensor). tpu tensors
    have no ZeroTensor bit, so it is an ordinary tensor of zeros."""
    return jnp.zeros(size, _runtime.jax_dtype(dtype or torch.get_default_dtype()))


@lowering(aten.frexp.Tensor)
def _frexp(self):
    mantissa, exponent = jnp.frexp(self)
    return mantissa, exponent.astype(jnp.int32)


# ---------------------------------------------------------------- complex numbers
@lowering(aten.complex.default)
def _complex(real, imag):
    if real.dtype != imag.dtype:  # (compiled: the meta kernel lets it through; CPU's words)
        raise RuntimeError(f"Expected object of scalar type {scalar_type_name(real.dtype)} but "
                           f"got scalar type {scalar_type_name(imag.dtype)} for second argument")
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lowering(aten.polar.default)
def _polar(magnitude, angle):
    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@lowering(aten._conj_physical.default)
def _conj_physical(self):
    return jnp.conj(self)


# ---------------------------------------------------------------- comparisons, logic, bits
_COMPARISONS = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less,
                "le": jnp.less_equal, "gt": jnp.greater, "ge": jnp.greater_equal}
for _name, _fn in _COMPARISONS.items():
    _packet = getattr(aten, _name)
    # compared in the common dtype: a bf16 tensor against 1.1 sees 1.1 rounded to bf16
    pointwise(_packet.Tensor, _packet.Scalar, operands=2, opmath=False)(_fn)


@lowering(aten.equal.default)
def _equal(self, other):
    """torch.equal as a 0-dim bool: False for another shape, else whether every element
    is equal in the common dtype (so NaN != NaN)."""
    if self.shape != other.shape:
        return jnp.asarray(False)
    a, b = promote(self, other)
    return jnp.all(a == b)


def _logical(fn):
    # any dtype; nonzero is True, so no promotion between the operands
    return lambda self, other: fn(jnp.asarray(self) != 0, jnp.asarray(other) != 0)


lowering(aten.logical_and.default)(_logical(jnp.logical_and))
lowering(aten.logical_or.default)(_logical(jnp.logical_or))
lowering(aten.logical_xor.default)(_logical(jnp.logical_xor))

for _name, _fn in [("bitwise_and", jnp.bitwise_and), ("bitwise_or", jnp.bitwise_or),
                   ("bitwise_xor", jnp.bitwise_xor)]:
    _packet = getattr(aten, _name)
    pointwise(_packet.Tensor, _packet.Scalar, _packet.Scalar_Tensor, operands=2)(_fn)


# XLA's shifts already give torch's results for amounts < 0 or >= the bit width: left
# shifts give 0, right shifts fill with the sign bit (arithmetic) or zeros (unsigned).
@pointwise(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
           aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor,
           aten.__lshift__.Scalar, operands=2)
def _shift_left(a, b):
    return lax.shift_left(*jnp.broadcast_arrays(a, b))


@pointwise(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
           aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor,
           aten.__rshift__.Scalar, operands=2)
def _shift_right(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    if jnp.issubdtype(a.dtype, jnp.signedinteger):
        return lax.shift_right_arithmetic(a, b)
    return lax.shift_right_logical(a, b)


# ---------------------------------------------------------------- selection and fused ops
@lowering(aten.where.self)
def _where(condition, self, other):
    a, b = promote(self, other)
    return jnp.where(jnp.asarray(condition).astype(jnp.bool_), a, b)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(self, mask, value):
    # no promotion: the value is converted to self's dtype (a float into ints truncates)
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)


def _clamp(x, lo=None, hi=None):
    # max then min, both NaN-propagating: when lo > hi every element becomes hi, as torch
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


pointwise(aten.clamp.default, aten.clamp.Tensor, operands=3)(_clamp)
pointwise(aten.clamp_min.default, aten.clamp_min.Tensor, operands=2)(jnp.maximum)
pointwise(aten.clamp_max.default, aten.clamp_max.Tensor, operands=2)(jnp.minimum)


def _lerp(start, end, weight):
    w = scalar_like(weight, start)
    # torch's two-sided formula: exact at weight 0 and at weight 1
    small = jnp.abs(w) < 0.5
    return jnp.where(small, start + w * (end - start), end - (end - start) * (1 - w))


pointwise(aten.lerp.Scalar, operands=2)(_lerp)
pointwise(aten.lerp.Tensor, operands=3)(_lerp)


@pointwise(aten.addcmul.default, operands=3)
def _addcmul(self, tensor1, tensor2, value=1):
    return self + scalar_like(value, self) * tensor1 * tensor2


@pointwise(aten.addcdiv.default, operands=3)
def _addcdiv(self, tensor1, tensor2, value=1):
    return self + scalar_like(value, self) * tensor1 / tensor2

