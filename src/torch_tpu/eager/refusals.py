"""torch's refusals that the route to XLA would skip, restored in one place.

An op's result shapes and dtypes come from torch's meta kernels (eager/opcall.py). Once
torch is imported, most of those are Python functions (torch._refs, _meta_registrations)
that replace the C++ structured meta kernels, and they skip checks that CPU and CUDA run
in those C++ kernels: a write through an expanded view, an out= tensor of a dtype the
result can't be cast to, a dim out of range (`sort(dim=5)` passes the Python meta), a
reduction without identity over no element. A lowering then refuses bad input the way
JAX does (a ValueError from jnp), or not at all. So, per new call signature (shapes,
strides and dtypes are in the cache key, and these rules read only those):

- `check_call` runs torch's rules before the meta kernel, with CPU's exception classes
  and wording;
- `torch_error` turns what a lowering raises while it is traced (the executor traces it
  when the signature is first seen, so that DeferAndFuse raises at the call too) into
  torch's exception classes;
- `check_out` is the out= kernels' (_dispatch.py) half: overlap, and TensorIterator's
  casting rule, then the out= overload's own meta kernel for the other ops' rules.
"""
from __future__ import annotations

import re
import warnings
from typing import NamedTuple

import jax
import torch

from .. import _tree, metrics
from ..lowering import registry
from ..lowering._dtypes import scalar_type_name

_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers "
            "to a single memory location. Please clone() the tensor before performing the "
            "operation.")

# In-place ops CPU lets write through a view whose elements share memory (an expanded
# tensor): their kernels skip TensorIterator's overlap check (fill_, zero_: built with
# check_mem_overlap(false); masked_fill_, index_fill_, index_put_: a deprecation warning
# only; the others never check). Found by running every OpInfo in-place variant on an
# expanded tensor on CPU; the other 127 of 152 refuse. out= tensors are checked always:
# the few out= kernels that skip the check on CPU (bmm, mv, std, var, histc, ...) write
# racy garbage there.
_OVERLAP_ALLOWED = frozenset({
    "aten::fill_", "aten::zero_", "aten::masked_fill_", "aten::index_fill_",
    "aten::index_put_", "aten::_index_put_impl_", "aten::tril_", "aten::triu_",
    "aten::baddbmm_", "aten::addmv_", "aten::threshold_", "aten::conj_physical_"})

# schema arguments that count self's dims (torch wraps them with maybe_wrap_dim)
_DIM_ARGS = frozenset({"dim", "dims", "dim0", "dim1", "dim2"})
# ops whose dim counts the result's dims, one more than self has
_RESULT_DIMS = {"aten::unsqueeze_copy": 1}

# Reductions without an identity refuse to reduce no element, on CPU and CUDA alike:
# name -> (class, message) for a whole empty tensor, or None where that is fine (median of
# nothing is nan); over an empty dim each raises IndexError.
def _unspecified(name, cls=RuntimeError, tail=" Specify the reduction dim with the 'dim' argument."):
    return cls, f"{name}(): Expected reduction dim to be specified for input.numel() == 0.{tail}"


_NO_IDENTITY = {
    "aten::max": _unspecified("max"), "aten::min": _unspecified("min"),
    "aten::amax": _unspecified("amax"), "aten::amin": _unspecified("amin"),
    "aten::argmax": _unspecified("argmax", IndexError, ""),
    "aten::argmin": _unspecified("argmin", IndexError, ""),
    "aten::aminmax": (RuntimeError, ("aminmax(): cannot compute aminmax over an empty "
                                     "dimension as the operation has no identity.")),
    "aten::median": None, "aten::nanmedian": None, "aten::kthvalue": None, "aten::mode": None,
}

# ops that take a list of index tensors (torch's checkIndexTensorTypes)
_INDEX_LISTS = frozenset({"aten::index", "aten::_unsafe_index", "aten::index_put",
                          "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index_put"})
_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


class _Facts(NamedTuple):
    """What check_call reads of an overload, computed once."""
    dims: tuple          # indices of the arguments that count self's dims
    extra: int           # how many more dims than self's they may count (unsqueeze: 1)
    no_identity: bool    # a reduction that refuses to reduce no element
    whole: tuple         # its (class, message) for an empty whole tensor, or None
    overlap_ok: bool     # may write through overlapping memory (_OVERLAP_ALLOWED)
    cast_from: object    # a pointwise in-place op's functional overload, whose result
    #                      dtype must cast to self's (TensorIterator); else None
    index_list: bool     # takes a list of index tensors


_FACTS: dict = {}


def _facts(plan):
    facts = _FACTS.get(plan.op)
    if facts is None:
        schema = plan.op._schema
        args = schema.arguments
        dims = ()
        if args and args[0].name == "self" and str(args[0].type) == "Tensor":
            dims = tuple(i for i, a in enumerate(args)
                         if a.name in _DIM_ARGS and "int" in str(a.type).lower())
        name = schema.name
        cast_from = None
        if plan.mutable == (0,) and args[0].name == "self" and torch.Tag.pointwise in plan.op.tags:
            cast_from = registry.functional_variant(plan.op)
        facts = _FACTS[plan.op] = _Facts(dims, _RESULT_DIMS.get(name, 0), name in _NO_IDENTITY,
                                         _NO_IDENTITY.get(name), name in _OVERLAP_ALLOWED,
                                         cast_from, name in _INDEX_LISTS)
    return facts


# ---------------------------------------------------------------- per new call signature
def check_call(plan, vals) -> None:
    """torch's refusals for this call that the meta kernel may skip (see the top)."""
    facts = _facts(plan)
    for i in facts.dims:
        _check_dims(vals[0], vals[i], facts.extra)
    if facts.no_identity:
        _check_nonempty(plan, vals, facts.whole)
    if facts.index_list:
        _check_index_list(vals[0], vals[1])
    if not facts.overlap_ok:
        for i in plan.mutable:
            v = vals[i]
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                check_no_overlap(t)
    if facts.cast_from is not None:
        _check_inplace_cast(plan, facts.cast_from, vals)


def _check_index_list(self, indices) -> None:
    """torch's checkIndexTensorTypes and expandTensors: index dtypes, and a bool/byte
    mask's shape against the dims it covers (the lowering would silently read a mask of
    the wrong shape)."""
    dim = 0
    for t in indices:
        if not isinstance(t, torch.Tensor):
            dim += 1  # None: a whole dim
            continue
        if t.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if t.dtype in (torch.bool, torch.uint8):
            if dim + t.dim() > self.dim():
                raise IndexError(f"too many indices for tensor of dimension {self.dim()}")
            for j in range(t.dim()):
                if t.shape[j] != self.shape[dim + j]:
                    raise IndexError(
                        f"The shape of the mask {list(t.shape)} at index {j} does not match the "
                        f"shape of the indexed tensor {list(self.shape)} at index {dim + j}")
            dim += t.dim()
        else:
            dim += 1


def _check_inplace_cast(plan, functional, vals):
    """TensorIterator's rule for `self.op_(...)`: the functional op's result dtype must
    cast to self's (long.add_(1.5) refuses; torch's Python meta kernels skip the rule for
    some ops and word it their own way for others)."""
    self = vals[0]
    if not isinstance(self, torch.Tensor):
        return
    margs = [_tree.to_meta(v) for v in vals]
    kw = {plan.names[i]: margs[i] for i in range(plan.npos, len(margs))}
    try:
        result = functional(*margs[:plan.npos], **kw)
    except Exception:  # noqa: BLE001 - the functional op refuses too: the in-place meta says why
        return
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, self.dtype):
        raise RuntimeError(f"result type {scalar_type_name(result.dtype)} can't be cast to the "
                           f"desired output type {scalar_type_name(self.dtype)}")


def check_no_overlap(t) -> None:
    """A tensor an op writes must not have two elements at one address (CPU's
    assert_no_internal_overlap; a strided layout it cannot decide passes, as on CPU)."""
    if isinstance(t, torch.Tensor) and torch._debug_has_internal_overlap(t) == 1:
        raise RuntimeError(_OVERLAP)


def dim_error(dim, ndim) -> IndexError:
    n = max(ndim, 1)  # a 0-dim tensor takes dims -1 and 0
    return IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                      f"but got {dim})")


def _check_dims(self, value, extra=0):
    if not isinstance(self, torch.Tensor) or value is None:
        return
    ndim = self.dim() + extra
    n = max(ndim, 1)
    for d in (value if isinstance(value, (list, tuple)) else (value,)):
        if isinstance(d, int) and not -n <= d < n:
            raise dim_error(d, ndim)


def _check_nonempty(plan, vals, whole):
    self = vals[0]
    dim = vals[plan.names.index("dim")] if "dim" in plan.names else None
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        if whole is not None and self.numel() == 0:
            cls, message = whole
            raise cls(message)
        return
    if self.dim() == 0:
        return
    short = plan.op._schema.name.split("::")[-1]
    listed = isinstance(dim, (list, tuple))
    for d in (dim if listed else (dim,)):
        if self.shape[d] == 0:
            shown = d if listed else d % self.dim()  # as CPU prints it
            sep = ":" if short == "aminmax" else "():"
            raise IndexError(f"{short}{sep} Expected reduction dim {shown} to have non-zero size.")


# ---------------------------------------------------------------- lowering errors
# what JAX raises for a traced value used as a Python one: a lowering that needs concrete
# data (a bug or a data-dependent shape), never a refusal of the user's input
_JAX_TRACER_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                      jax.errors.TracerIntegerConversionError, jax.errors.UnexpectedTracerError)
_AXIS = re.compile(r"axis (-?\d+) is out of bounds for array of dimension (\d+)")
# jnp refusing an operand's dtype: the op has no kernel for it (CPU: NotImplementedError)
_NO_KERNEL = re.compile(r"does not accept dtype (\w+)")


def torch_error(plan, exc):
    """The exception to raise for `exc`, raised while compiling `plan`. jnp and lax refuse
    bad arguments with ValueError and TypeError where torch's kernels raise RuntimeError
    (and IndexError for a dim), so an `except RuntimeError` written for CPU catches them.
    None: raise `exc` as it is (torch's own errors, and what is not a refusal of the
    input)."""
    if not isinstance(exc, (ValueError, TypeError)) or isinstance(exc, _JAX_TRACER_ERRORS):
        return None
    msg = str(exc)
    m = _AXIS.search(msg)
    if m is not None:
        return dim_error(int(m.group(1)), int(m.group(2)))
    m = _NO_KERNEL.search(msg)
    if m is not None and isinstance(exc, TypeError):
        short = plan.op._schema.name.split("::")[-1]
        return NotImplementedError(f'"{short}" not implemented for '
                                   f"'{scalar_type_name(jax.numpy.dtype(m.group(1)))}' ({plan.name}: {msg})")
    return RuntimeError(f"{plan.name}: {msg}")


# ---------------------------------------------------------------- out= variants
_OUT_OK: set = set()  # dtype signatures whose out= meta kernel passed


def check_out(op, functional, results, outs, args, kwargs) -> None:
    """An out= call's refusals, before its results are copied into `outs`: a written
    tensor with overlapping elements, then TensorIterator's rule for pointwise ops (the
    result dtype must cast to the out dtype, safely: float into long refuses), then the
    out= overload's meta kernel, which holds the other ops' rules (mm, softmax, ...: the
    exact dtype; sum: any), once per dtype signature."""
    for dst in outs:
        check_no_overlap(dst)
    if torch.Tag.pointwise in functional.tags:
        for src, dst in zip(results, outs):
            if isinstance(src, torch.Tensor) and not torch.can_cast(src.dtype, dst.dtype):
                raise RuntimeError(
                    f"result type {scalar_type_name(src.dtype)} can't be cast to the desired "
                    f"output type {scalar_type_name(dst.dtype)}")
    sig = (op, _signature(args), _signature(kwargs))
    if sig in _OUT_OK:
        return
    margs = _tree.to_meta(list(args))
    mkwargs = {k: _tree.to_meta(v) for k, v in kwargs.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the resize warning comes from the real call
            op(*margs, **mkwargs)
    except NotImplementedError:  # no meta kernel: no verdict
        metrics.count("out_meta_unchecked")
    except RuntimeError:
        raise
    except Exception:  # noqa: BLE001 - a Python meta kernel that breaks: no verdict
        metrics.count("out_meta_unchecked")
    _OUT_OK.add(sig)


def _signature(v):
    """What decides an out= call's dtype rules: dtypes (and whether a tensor is 0-dim,
    which ranks it lower in promotion), the types of numbers; other values as they are."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.dim() == 0)
    if isinstance(v, dict):
        return tuple((k, _signature(x)) for k, x in sorted(v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_signature(x) for x in v)
    if isinstance(v, (bool, int, float, complex)):
        return type(v)
    try:
        hash(v)
    except TypeError:
        return type(v)
    return v
