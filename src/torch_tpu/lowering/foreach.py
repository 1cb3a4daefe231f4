"""torch._foreach_* ops, as one program over the whole list.

torch.optim (and clip_grad_norm_, zero_grad) defaults to these on a foreach-capable
device; lowering each as a single jitted function updates every parameter in one call
instead of one dispatch per tensor. Each element is computed by the elementwise op's own
lowering, so a foreach op and its per-tensor loop give the same values. The in-place
variants (`_foreach_add_`, ...) map to these functional ones by the registry's rule.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .. import _runtime
from . import pointwise, special  # noqa: F401  (registers the element ops mapped below)
from ._dtypes import opmath_dtype
from .registry import LOWERINGS, aten, keyed_scalars, lowering


def _functional_overloads(packet):
    """The overloads that neither mutate nor write an out= list."""
    for name in packet.overloads():
        op = getattr(packet, name)
        if not any(a.is_out or (a.alias_info is not None and a.alias_info.is_write)
                   for a in op._schema.arguments):
            yield op


def _zipped(arg) -> bool:
    # Tensor[] and Scalar[] hold one entry per element; so does the `scalars` tensor of
    # _foreach_addcmul/addcdiv.Tensor (torch reads it as a list of Scalars). Any other
    # Tensor (`other` of _foreach_mul.Tensor) is shared by every element.
    return str(arg.type).startswith("List[") or arg.name == "scalars"


def _register_map(foreach_op, element_op):
    """Lower `foreach_op` as `element_op`'s lowering applied across the lists."""
    element = LOWERINGS[element_op]
    schema_args = foreach_op._schema.arguments
    zipped = [_zipped(a) for a in schema_args if not a.kwarg_only]

    def lower(*args, **kwargs):
        n = len(next(a for a, z in zip(args, zipped) if z))
        return [element(*[a[i] if z else a for a, z in zip(args, zipped)], **kwargs)
                for i in range(n)]

    lower.__name__ = f"foreach_{element_op.overloadpacket.__name__}"
    lowering(foreach_op)(lower)


_UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]
for _name in _UNARY:
    _register_map(getattr(aten, "_foreach_" + _name).default, getattr(aten, _name).default)

# every overload (List, Scalar, ScalarList, Tensor) of these maps to one elementwise op,
# whose lowering already accepts a tensor or a Python number for each operand
_BINARY = {
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor,
    "div": aten.div.Tensor, "pow": aten.pow.Tensor_Tensor,
    "maximum": aten.maximum.default, "minimum": aten.minimum.default,
    "clamp_min": aten.clamp_min.Tensor, "clamp_max": aten.clamp_max.Tensor,
    "addcmul": aten.addcmul.default, "addcdiv": aten.addcdiv.default,
}
for _name, _element in _BINARY.items():
    for _op in _functional_overloads(getattr(aten, "_foreach_" + _name)):
        _register_map(_op, _element)

# a Scalar weight is lerp.Scalar's (read at opmath precision), a tensor one lerp.Tensor's
_register_map(aten._foreach_lerp.List, aten.lerp.Tensor)
_register_map(aten._foreach_lerp.Scalar, aten.lerp.Scalar)
_register_map(aten._foreach_lerp.ScalarList, aten.lerp.Scalar)


@lowering(aten._foreach_copy.default)
def _foreach_copy(self, src, non_blocking=False):
    return [jnp.broadcast_to(s.astype(d.dtype), d.shape) for d, s in zip(self, src)]


@lowering(aten._foreach_zero.default)
def _foreach_zero(self):
    return [jnp.zeros_like(x) for x in self]


@lowering(aten._foreach_clone.default)
def _foreach_clone(self, *, memory_format=None):
    return list(self)


# ---------------------------------------------------------------- reductions
def _accumulate(xs, dtype):
    """|x| of each tensor, in the dtype torch accumulates norms in: the opmath type of the
    requested (or the tensor's own real) dtype."""
    out = []
    for x in xs:
        a = jnp.abs(x)  # complex -> its real dtype
        dt = a.dtype if dtype is None else _runtime.jax_dtype(dtype)
        out.append(a.astype(opmath_dtype(dt)))
    return out


def _p_norm(a, p):
    return jnp.sum(a ** p) ** (1 / p)


@lowering(aten._foreach_norm.Scalar)
@keyed_scalars("ord")
def _foreach_norm(self, ord=2, dtype=None):
    """torch.linalg.vector_norm of each tensor. A common `ord` (2, 1, inf: SCALAR_KEYED)
    comes as a Python number and picks its case here; another is traced, and the case is
    picked by lax.switch inside the program (each branch costs XLA:CPU ~15 ms of compile
    per tensor list)."""
    xs = _accumulate(self, dtype)
    branches = [
        lambda xs: [jnp.sqrt(jnp.sum(a * a)) for a in xs],
        lambda xs: [jnp.sum(a) for a in xs],
        lambda xs: [jnp.max(a) for a in xs],
        lambda xs: [jnp.min(a) for a in xs],
        lambda xs: [jnp.sum(a != 0).astype(a.dtype) for a in xs],
        lambda xs: [_p_norm(a, jnp.asarray(ord, a.dtype)) for a in xs],
    ]
    if type(ord) in (int, float):
        return branches[{2: 0, 1: 1, jnp.inf: 2, -jnp.inf: 3, 0: 4}.get(ord, 5)](xs)
    p = jnp.asarray(ord)
    index = jnp.select([p == 2, p == 1, p == jnp.inf, p == -jnp.inf, p == 0], [0, 1, 2, 3, 4], 5)
    return lax.switch(index, branches, xs)


@lowering(aten._foreach_powsum.Scalar)
def _foreach_powsum(self, ord=2, dtype=None):
    return [jnp.sum(a ** jnp.asarray(ord, a.dtype)) for a in _accumulate(self, dtype)]


@lowering(aten._foreach_max.default)
def _foreach_max(self):
    return [jnp.max(x) for x in self]
