"""Elementwise ops. Type promotion is torch's: inputs are cast to the computation dtype
that torch's rules give (torch.result_type over the real arguments), never JAX's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .registry import aten, lowering


def _compute_dtype(*xs):
    """The dtype torch would compute in, for jax arrays and Python scalars."""
    import torch

    from .._runtime import jax_dtype, torch_dtype

    args = []
    for x in xs:
        if isinstance(x, (jax.Array, jax.core.Tracer)) or hasattr(x, "dtype"):
            t = torch_dtype(x.dtype)
            args.append(torch.empty((1,) * min(x.ndim, 1) if x.ndim else (), dtype=t, device="meta"))
        else:
            args.append(x)
    if len(args) == 1:
        a = args[0]
        return jax_dtype(a.dtype) if hasattr(a, "dtype") else None
    res = args[0]
    dt = None
    for a in args[1:]:
        dt = torch.result_type(res, a)
        res = torch.empty((1,), dtype=dt, device="meta") if (
            getattr(res, "ndim", 0) or getattr(a, "ndim", 0)) else torch.empty((), dtype=dt, device="meta")
    return jax_dtype(dt)


def _promote(*xs):
    dt = _compute_dtype(*xs)
    return [jnp.asarray(x, dt) if not hasattr(x, "dtype") else x.astype(dt) for x in xs]


def _floatify(x):
    if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating):
        return x
    return x.astype(jnp.float32)


def binary(*ops, float_out=False):
    def register(fn):
        def lower(self, other, *args, **kwargs):
            a, b = _promote(self, other)
            if float_out:
                a, b = _floatify(a), _floatify(b)
            return fn(a, b, *args, **kwargs)

        return lowering(*ops)(lower)

    return register


def unary(*ops, float_out=False):
    def register(fn):
        def lower(self, *args, **kwargs):
            x = jnp.asarray(self)
            if float_out:
                x = _floatify(x)
            return fn(x, *args, **kwargs)

        return lowering(*ops)(lower)

    return register


# ---------------------------------------------------------------- arithmetic
@binary(aten.add.Tensor, aten.add.Scalar)
def _add(a, b, alpha=1):
    return a + b * alpha if not (isinstance(alpha, int) and alpha == 1) else a + b


@binary(aten.sub.Tensor, aten.sub.Scalar)
def _sub(a, b, alpha=1):
    return a - b * alpha if not (isinstance(alpha, int) and alpha == 1) else a - b


@binary(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(a, b, alpha=1):
    return b - a * alpha


@binary(aten.mul.Tensor, aten.mul.Scalar)
def _mul(a, b):
    return a * b


@lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(self, other, rounding_mode=None):
    a, b = _promote(self, other)
    if rounding_mode is None:
        a, b = _floatify(a), _floatify(b)
        return a / b
    if rounding_mode == "trunc":
        if jnp.issubdtype(a.dtype, jnp.integer):
            return lax.div(a, b)
        return jnp.trunc(a / b)
    return jnp.floor_divide(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else jnp.floor(a / b)
