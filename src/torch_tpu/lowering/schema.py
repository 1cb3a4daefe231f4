"""Per-overload facts read from an op's schema, computed once: the one home of what the
eager op plans (op/opcall.py `OpPlan`) and the compile backend (compile/lower.py
`OpInfo`) know about an overload before they see a call.

Argument kinds are numbered; csrc/scan.cpp switches on the same numbers (csrc/contracts.h,
exported as `_C.CONTRACTS["kinds"]` and checked against `KINDS` here by
tests/unit/test_c_contracts.py). The order matters: `kind <= OPT_TENSOR` means "one tensor argument" and
`kind <= OPT_TENSOR_LIST` (after the scalar kinds are ruled out) "a tensor list".
"""
from __future__ import annotations

import torch

from . import registry

(TENSOR, OPT_TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, SCALAR, SCALAR_LIST, GENERATOR, STATIC,
 STATIC_NUMBER, SCALAR_KEYED) = range(10)
KINDS = {"TENSOR": TENSOR, "OPT_TENSOR": OPT_TENSOR, "TENSOR_LIST": TENSOR_LIST,
         "OPT_TENSOR_LIST": OPT_TENSOR_LIST, "SCALAR": SCALAR, "SCALAR_LIST": SCALAR_LIST,
         "GENERATOR": GENERATOR, "STATIC": STATIC, "STATIC_NUMBER": STATIC_NUMBER,
         "SCALAR_KEYED": SCALAR_KEYED}
# SCALAR_KEYED: a Scalar whose common values (KEYED_VALUES, an exact int or float) are
# constants of the program, keyed by value, and any other value is traced as a SCALAR's
# is. A lowering names such arguments (registry.keyed_scalars) where a traced value would
# be a branch inside the program: pow's exponent (x ** 2 as a 5-way switch compiles in
# ~100 ms on XLA:CPU, x * x alone in ~27 ms; RMSNorm's forward and backward use three) and
# a norm's order (clip_grad_norm_'s 2). csrc/scan.cpp keyed_scalar tests the same values.
KEYED_VALUES = frozenset({0.5, 1, 2, 3, float("inf")})


def keyed(v) -> bool:
    """Whether a SCALAR_KEYED argument's value is a constant of the program."""
    return type(v) in (int, float) and v in KEYED_VALUES


TENSOR_KINDS = (TENSOR, OPT_TENSOR, TENSOR_LIST, OPT_TENSOR_LIST)

_BY_TYPE = {
    "Tensor": TENSOR,
    "Optional[Tensor]": OPT_TENSOR,
    "List[Tensor]": TENSOR_LIST,
    "List[Optional[Tensor]]": OPT_TENSOR_LIST,
    "Scalar": SCALAR,
    "number": SCALAR,
    "Optional[number]": SCALAR,
    "List[number]": SCALAR_LIST,
    "Optional[Generator]": GENERATOR,
}


def kind(arg) -> int:
    """The kind of one schema argument; everything without a kind of its own (ints, bools,
    dtypes, int lists, strings) is STATIC: part of the cache key, a constant of the
    program."""
    t = arg.type
    name = t.annotation_str if hasattr(t, "annotation_str") else str(t)
    return _BY_TYPE.get(name, _BY_TYPE.get(str(t), STATIC))


def op_name(op) -> str:
    """`aten::add.Tensor`: the name every message about an op uses."""
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


class OpSchema:
    """What an overload's schema says, for a lowering `fn` of it."""

    __slots__ = ("op", "name", "lowering", "kinds", "names", "npos", "defaults", "mutable",
                 "ret_alias", "nrets", "factory", "seeded", "dynamic_shape")

    def __init__(self, op, fn):
        schema = op._schema
        self.op = op
        self.name = op_name(op)
        self.lowering = fn
        args = schema.arguments
        kinds = [kind(a) for a in args]
        self.factory = not any(k in TENSOR_KINDS for k in kinds)
        if self.factory:
            # factories (arange, full, scalar_tensor): their scalars decide shapes or are
            # constants of a program that has no inputs, so they stay Python numbers and
            # key the cache by value (with their type: arange(8) and arange(8.0) differ,
            # yet 8 == 8.0)
            kinds = [STATIC_NUMBER if k == SCALAR else k for k in kinds]
        if getattr(fn, "traced_floats", False):
            kinds = [SCALAR if str(a.type) == "float" else k for a, k in zip(args, kinds)]
        keyed = getattr(fn, "keyed_scalars", ())
        kinds = [SCALAR_KEYED if k == SCALAR and a.name in keyed else k
                 for a, k in zip(args, kinds)]
        self.kinds = tuple(kinds)
        self.names = tuple(a.name for a in args)
        self.npos = sum(1 for a in args if not a.kwarg_only)
        self.defaults = tuple(a.default_value if a.has_default_value() else None for a in args)
        # argument indices the op writes (in-place and out= ops)
        self.mutable = tuple(
            i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
        owner = {}
        for i in self.mutable:
            for s in args[i].alias_info.before_set:
                owner[s] = i
        # per schema return: the index of the argument it aliases (in-place ops), or None
        # (a list of views, `Tensor(a)[]` as split returns, has an empty alias set itself)
        self.ret_alias = tuple(
            owner.get(next(iter(r.alias_info.before_set), None)) if r.alias_info is not None
            else None for r in schema.returns)
        self.nrets = len(schema.returns)
        self.seeded = registry.seeded(op, fn)
        self.dynamic_shape = torch.Tag.dynamic_output_shape in op.tags
