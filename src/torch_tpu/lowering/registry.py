"""The lowering table: aten OpOverload -> JAX function. One table for every mode and for
torch.compile.

A lowering receives the op's arguments in schema order (kwarg-only ones as keywords),
with tensors replaced by jax arrays, and returns what the op returns (for an in-place
or out= op: the new values of the mutated tensors, in order). Result dtypes follow
torch's rules: the executor casts every result to the dtype torch's own meta kernel
gives, so a lowering never has to re-derive promotion for its outputs. Seeded ops
(tag `nondeterministic_seeded`) receive `generator=` a JAX PRNG key.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

LOWERINGS: dict = {}
# rules for ops that reach compiled graphs but never a tpu kernel in eager (C++ kernels or
# torch's composites handle them first): views, factories, `_to_copy` (compile/lower.py)
GRAPH_ONLY: dict = {}


def _overloads(op):
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lowering(*ops, graph_only=False):
    """Register `fn` as the lowering of every given OpOverload (a packet means all of its
    overloads). A second registration of the same overload, in either table, is a bug and
    raises. `graph_only=True` registers a compile-only rule (GRAPH_ONLY): it also receives
    `meta=`, the node's fake result, and no eager kernel is made for it."""
    table = GRAPH_ONLY if graph_only else LOWERINGS

    def register(fn):
        for packet_or_op in ops:
            for op in _overloads(packet_or_op):
                if op in LOWERINGS or op in GRAPH_ONLY:
                    raise RuntimeError(f"duplicate lowering for {op}")
                table[op] = fn
        return fn

    return register


def never_draws(fn):
    """Mark a lowering of an op that torch tags `nondeterministic_seeded` but that draws no
    random numbers here (fused attention: dropout stays on torch's math path). The
    executors then pass it no generator and advance no offset, and key it like any op."""
    fn.never_draws = True
    return fn


def draws(fn):
    """Mark a rule that draws random numbers whatever its op's tags say (the random
    factories of compiled graphs: rand, randn, randint)."""
    fn.draws = True
    return fn


def traced_floats(fn):
    """Mark a lowering whose `float` arguments are traced scalars rather than constants of
    the program: the fused optimizers' hyperparameters, which a learning-rate schedule
    changes every step (as constants, every new value would compile a new program)."""
    fn.traced_floats = True
    return fn


def keyed_scalars(*names):
    """Mark a lowering whose Scalar arguments `names` pass their common values
    (lowering/schema.py KEYED_VALUES) as Python numbers, each keying a program of its own,
    and any other value as a traced scalar (SCALAR_KEYED)."""
    def mark(fn):
        fn.keyed_scalars = frozenset(names)
        return fn

    return mark


def index_bounds(spec):
    """Declare a lowering's index arguments: `spec(vals)` (the op's arguments in schema
    order) -> [lowering.bounds.Bound]. Debug checks them on the host before the op runs;
    Strict and DeferAndFuse add a validity code to the op's program, raised at the next
    synchronization (op/asserts.py: CUDA's device-side asserts)."""
    def mark(fn):
        fn.index_bounds = spec
        return fn
    return mark


def bounds_of(fn):
    """The index-bounds spec a lowering declared, or None."""
    return getattr(fn, "index_bounds", None)


def seeded(op, fn) -> bool:
    """Whether a lowering takes `generator=` (a JAX key) for this op."""
    if getattr(fn, "draws", False):
        return True
    return torch.Tag.nondeterministic_seeded in op.tags and not getattr(fn, "never_draws", False)


# out= variants whose functional op is a CompositeImplicitAutograd one (torch decomposes it
# before any tpu kernel, so it has no lowering, and a lowering of it would take its
# autograd away), while the out= variant has kernels of its own: the lowered op the
# composite calls computes their values
OUT_OF_COMPOSITE = {
    aten.linalg_eigvals.out: aten._linalg_eigvals.default,
}


def functional_variant(op):
    """For an in-place (`add_`) or out= (`add.out`) overload, the functional overload whose
    lowering computes its values; None when there is none. An out= variant's functional
    may write arguments of its own (`_native_batch_norm_legit.out`: the running stats)."""
    if op in OUT_OF_COMPOSITE:
        return OUT_OF_COMPOSITE[op]
    schema = op._schema
    packet_name = op.overloadpacket.__name__
    ns = getattr(torch.ops, op.namespace)
    mutable = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if not mutable:
        return None
    if packet_name.endswith("_") and not packet_name.startswith("_"):
        base = getattr(ns, packet_name[:-1], None)
    elif packet_name.endswith("_") and packet_name.startswith("_"):
        base = getattr(ns, packet_name[:-1], None)  # e.g. _foreach_add_ -> _foreach_add
    else:
        base = getattr(ns, packet_name, None)
    if base is None:
        return None
    is_out = any(a.is_out for a in schema.arguments)
    want = [
        (a.name, str(a.type))
        for a in schema.arguments
        if not (is_out and a.is_out)
    ]
    if not is_out:
        # in-place: same overload name, self is mutable instead of returned
        candidate = getattr(base, op._overloadname, None)
        if candidate is not None and not _mutates(candidate):
            return candidate
    for name in base.overloads():
        cand = getattr(base, name)
        if any(a.is_out for a in cand._schema.arguments) if is_out else _mutates(cand):
            continue
        args = [(a.name, str(a.type)) for a in cand._schema.arguments]
        # factory out= overloads (arange.start_out) lack the functional's TensorOptions
        bare = [a for a in args if not (is_out and a[0] in _TENSOR_OPTIONS)]
        if args == want or bare == want:
            return cand
    return None


_TENSOR_OPTIONS = {"dtype", "layout", "device", "pin_memory"}


def _mutates(op):
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def lookup(op):
    """The lowering that computes `op`'s results, following in-place/out= variants to
    their functional op."""
    fn = LOWERINGS.get(op)
    if fn is not None:
        return fn
    base = functional_variant(op)
    if base is not None:
        return LOWERINGS.get(base)
    return None
