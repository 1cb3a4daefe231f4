"""torch's dtype rules for every lowering family: type promotion, opmath and rounding.

Type promotion is torch's, never JAX's (JAX turns `int32 * 2.5` into float64 in x64 mode):
`result_dtype` reimplements c10's ResultTypeState (dimensioned tensors, zero-dim tensors and
Python numbers rank separately, a Python float means the default dtype), and the `pointwise`
factory declares each elementwise family's rule once. Half and bfloat16 operands are rounded
to their dtype like torch's TensorIterator does, then computed in float32 ("opmath", as
torch's CPU and CUDA kernels do); the executor rounds results back to torch's result dtype.

The families (pointwise, activation, special, foreach, linalg, nn, conv, loss, ...) import
these from here and never from each other, so the package's imports point one way.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .. import _runtime
from .registry import lowering

# ---------------------------------------------------------------- type promotion
_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64,
               torch.float64: torch.complex128}


def _is_number(x) -> bool:
    """A Python scalar, or the traced value of one: the executor passes Python numbers into
    jit, where JAX marks them weakly typed. torch ranks these below every tensor."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    return jnp.ndim(x) == 0 and bool(getattr(x, "weak_type", False))


def _default_float():
    return _runtime.jax_dtype(torch.get_default_dtype())


def _number_dtype(x) -> torch.dtype:
    """torch's dtype for a Python number: bool, int64, or the default (complex) dtype."""
    if isinstance(x, (bool, int, float, complex)):
        kind = type(x)
    else:
        dt = x.dtype
        kind = (bool if dt == jnp.bool_ else int if jnp.issubdtype(dt, jnp.integer)
                else complex if jnp.issubdtype(dt, jnp.complexfloating) else float)
    if kind is bool:
        return torch.bool
    if kind is int:
        return torch.int64
    default = torch.get_default_dtype()
    return _COMPLEX_OF[default] if kind is complex else default


def _widen(a, b):
    return b if a is None else a if b is None else torch.promote_types(a, b)


def _combine(higher, lower):
    """c10::combine_categories: a lower-ranked group only matters when it is of a higher
    category (bool < integer < floating < complex) than the higher-ranked one."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return _COMPLEX_OF.get(higher, lower) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def _result_torch_dtype(*xs) -> torch.dtype:
    dims = zero_dim = numbers = None
    for x in xs:
        if x is None:
            continue
        if _is_number(x):
            numbers = _widen(numbers, _number_dtype(x))
        elif jnp.ndim(x) == 0:
            zero_dim = _widen(zero_dim, _runtime.torch_dtype(x.dtype))
        else:
            dims = _widen(dims, _runtime.torch_dtype(x.dtype))
    return _combine(dims, _combine(zero_dim, numbers))


def result_dtype(*xs):
    """torch.result_type over any mix of jax arrays and Python numbers (None skipped), as a
    JAX dtype."""
    return _runtime.jax_dtype(_result_torch_dtype(*xs))


def promote(*xs):
    """Every operand (array or Python number; None stays None) cast to torch's common dtype."""
    dt = result_dtype(*xs)
    return [None if x is None else jnp.asarray(x).astype(dt) for x in xs]


# ---------------------------------------------------------------- opmath and rounding
def is_inexact(dt) -> bool:
    """A floating or complex dtype."""
    return jnp.issubdtype(dt, jnp.inexact)


def opmath_dtype(dt):
    """The dtype torch's kernels compute a dtype's math in: float32 for the 16-bit floats."""
    return jnp.dtype(jnp.float32) if is_inexact(dt) and jnp.finfo(dt).bits < 32 \
        and not jnp.issubdtype(dt, jnp.complexfloating) else jnp.dtype(dt)


def to_opmath(x):
    """x in the dtype torch computes with: float32 for bf16 and f16 (at::opmath_type); None
    stays None (an absent weight or bias)."""
    if x is not None and x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return x


def round_to(x, dtype):
    """`x` rounded to the precision of a 16-bit float `dtype`, staying in x's dtype. Where
    torch computes step by step in such a dtype (its scalar_t arithmetic rounds each
    result), this rounds where it does: XLA may keep the excess float32 precision even
    through an astype() round trip, but never through reduce_precision."""
    real = jnp.floating
    if not (jnp.issubdtype(dtype, real) and jnp.issubdtype(x.dtype, real)) \
            or jnp.finfo(dtype).bits >= jnp.finfo(x.dtype).bits:
        return x
    info = jnp.finfo(dtype)
    return lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def scalar_like(scalar, x):
    """A Scalar argument (alpha, value, weight, ...) in `x`'s dtype. torch converts these
    straight to the opmath type, without rounding them to a 16-bit dtype first."""
    return jnp.asarray(scalar).astype(x.dtype)


# ---------------------------------------------------------------- the elementwise family
def cast_operands(*xs, int_to_float=False, opmath=True, exact=()):
    """Cast operands like TensorIterator: to the common dtype (the default float dtype for
    int-to-float ops), then up to opmath. Indices in `exact` whose operand is zero-dim skip
    the rounding to the common dtype: torch's CPU mul and div read a scalar second operand
    at opmath precision (TensorIterator's original_scalar_value)."""
    dt = result_dtype(*xs)
    if int_to_float and not is_inexact(dt):
        dt = _default_float()
    math = opmath_dtype(dt) if opmath else dt
    out = []
    for i, x in enumerate(xs):
        if x is None:
            out.append(None)
            continue
        x = jnp.asarray(x)
        if x.dtype == dt or (i in exact and x.ndim == 0):
            out.append(x.astype(math))
        else:
            out.append(round_to(x.astype(dt).astype(math), dt))
    return out


def pointwise(*ops, operands=1, int_to_float=False, opmath=True, exact=()):
    """Register `fn` for `ops`: its first `operands` arguments arrive promoted by torch's
    rules (see `cast_operands`); the remaining arguments pass through unchanged."""

    def register(fn):
        def lower(*args, **kwargs):
            xs = cast_operands(*args[:operands], int_to_float=int_to_float, opmath=opmath,
                               exact=exact)
            return fn(*xs, *args[operands:], **kwargs)

        lower.__name__ = lower.__qualname__ = getattr(fn, "__name__", "pointwise")
        lower.__doc__ = fn.__doc__
        return lowering(*ops)(lower)

    return register


# ---------------------------------------------------------------- names in torch's messages
# c10 spells a dtype two ways in its errors: the ScalarType name ("result type Float can't be
# cast to the desired output type Long") and the C++ type name ("expected m1 and m2 to have
# the same dtype, but got: float != long int"). Refusals that torch's kernels make and its
# meta kernels skip quote them as CPU does.
_SCALAR_TYPE_NAMES = {
    torch.float32: ("Float", "float"), torch.float64: ("Double", "double"),
    torch.float16: ("Half", "c10::Half"), torch.bfloat16: ("BFloat16", "c10::BFloat16"),
    torch.int8: ("Char", "signed char"), torch.int16: ("Short", "short int"),
    torch.int32: ("Int", "int"), torch.int64: ("Long", "long int"),
    torch.uint8: ("Byte", "unsigned char"), torch.uint16: ("UInt16", "uint16_t"),
    torch.uint32: ("UInt32", "uint32_t"), torch.uint64: ("UInt64", "uint64_t"),
    torch.bool: ("Bool", "bool"), torch.complex64: ("ComplexFloat", "c10::complex<float>"),
    torch.complex128: ("ComplexDouble", "c10::complex<double>"),
    torch.float8_e4m3fn: ("Float8_e4m3fn", "c10::Float8_e4m3fn"),
    torch.float8_e5m2: ("Float8_e5m2", "c10::Float8_e5m2"),
    torch.float8_e4m3fnuz: ("Float8_e4m3fnuz", "c10::Float8_e4m3fnuz"),
    torch.float8_e5m2fnuz: ("Float8_e5m2fnuz", "c10::Float8_e5m2fnuz"),
    torch.float8_e8m0fnu: ("Float8_e8m0fnu", "c10::Float8_e8m0fnu"),
}


def _as_torch_dtype(dtype) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else _runtime.torch_dtype(dtype)


def scalar_type_name(dtype) -> str:
    """c10's ScalarType name of a torch or JAX dtype: Float, Long, BFloat16, ..."""
    dtype = _as_torch_dtype(dtype)
    return _SCALAR_TYPE_NAMES.get(dtype, (str(dtype), ""))[0]


def cpp_type_name(dtype) -> str:
    """The C++ type name c10 prints for a torch or JAX dtype: float, long int, ..."""
    dtype = _as_torch_dtype(dtype)
    return _SCALAR_TYPE_NAMES.get(dtype, ("", str(dtype)))[1]
