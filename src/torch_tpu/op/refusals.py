"""torch's refusals that the route to XLA would skip, restored in one place.

An op's result shapes and dtypes come from torch's meta kernels (op/opcall.py). Once
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

Where the answer depends on the kernel, CPU is asked (`cpu_verdict`): the call runs on
host stand-ins of the same layout (zeros, one host storage per tpu storage). That decides
two things no table here could without false refusals:
- a written tensor that shares memory with one the op reads: which ops refuse it (CPU's
  TensorIterator refuses a partial overlap, index_add_ even a full one, addmm_ neither).
  Debug and the out= kernels ask at every such call (CPU once per layout and sharing);
  Strict and DeferAndFuse at a new cache key, which says neither which arguments share
  a storage nor where a slice starts (its offset is data): a key first compiled for a
  call without overlap is not asked again (closing that needs csrc/scan.cpp to leave
  such calls to Python);
- the words and class of a refusal by a Python meta kernel or a lowering, which say
  "Attempting to broadcast a dimension of length 4" where CPU and CUDA say "The size of
  tensor a (3) must match the size of tensor b (4)": CPU's exception is raised instead,
  where CPU refuses the call too. Only calls that fail pay for it.
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
    if plan.mutable and _shares_storage([vals[i] for i in plan.mutable],
                                        [v for i, v in enumerate(vals) if i not in plan.mutable]):
        _check_aliasing(plan.op, *_call(plan, vals))


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


# ops whose CPU kernel does a subset of what tpu does (tensor-wise and row-wise scales, not
# MX blocks): CPU's refusal would name the wrong rules, so the meta kernel's or the lowering's
# words stand
_CPU_SUBSET = {torch.ops.aten._scaled_mm.default, torch.ops.aten._scaled_mm_v2.default}


def torch_error(plan, exc, vals=None):
    """The exception to raise for `exc`, raised while compiling `plan` for `vals`: CPU's
    own, where CPU refuses the call too (a meta kernel's or jnp's words are not CPU's).
    Else jnp and lax refuse bad arguments with ValueError and TypeError where torch's
    kernels raise RuntimeError (and IndexError for a dim), so an `except RuntimeError`
    written for CPU catches them. None: raise `exc` as it is (what CPU accepts, and what
    is not a refusal of the input)."""
    if isinstance(exc, _JAX_TRACER_ERRORS):
        return None
    if vals is not None and plan.op.namespace == "aten" and plan.op not in _CPU_SUBSET:
        # (a custom op's CPU kernel is its author's code, not a reference: torch_tpu.jax_op
        # runs the same function on CPU, and its error, naming the op, stands)
        # jnp refusing what torch's meta kernel passed: CPU likely accepts it, computing on
        # the stand-ins, so only a small call is asked (torch's refusals stop CPU's kernel
        # at its checks, before any work)
        limit = _ASK_BYTES if isinstance(exc, (ValueError, TypeError)) else None
        cpu = cpu_verdict(plan.op, *_call(plan, vals), limit=limit, scalars=True)
        if cpu is not None:
            return cpu
        metrics.count("refusals.not_cpus")  # CPU accepts the call, or has no kernel for it
    if not isinstance(exc, (ValueError, TypeError)):
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
    tensor with overlapping elements, then TensorIterator's rules for pointwise ops (an
    out that is also an input keeps its shape; the result dtype must cast to the out
    dtype, safely: float into long refuses), then the out= overload's meta kernel, which
    holds the other ops' rules (mm, softmax, ...: the exact dtype; sum: any), once per
    dtype signature; where that meta kernel refuses and CPU's kernel accepts, CPU decides."""
    for dst in outs:
        check_no_overlap(dst)
    inputs = _inputs_of_out(op, args, kwargs)
    if _shares_storage(outs, inputs):
        _check_aliasing(op, args, kwargs)
    if torch.Tag.pointwise in functional.tags:
        for src, dst in zip(results, outs):
            # an out that is also an input is never resized (ldexp_ is mul.out into self)
            if (isinstance(src, torch.Tensor) and src.shape != dst.shape
                    and any(dst is t for t in inputs)):
                raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the "
                                   f"broadcast shape {list(src.shape)}")
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
    except RuntimeError as e:
        ran: list = []
        cpu = cpu_verdict(op, args, kwargs, scalars=True, ran=ran)
        if cpu is not None:
            raise cpu from e
        if not ran:
            raise
        # a Python meta kernel stricter than CPU's kernel (bernoulli.out into an int64
        # out): CPU accepts the call, so tpu does, casting the results into the out
    except Exception:  # noqa: BLE001 - a Python meta kernel that breaks: no verdict
        metrics.count("out_meta_unchecked")
    if any(isinstance(src, torch.Tensor) and src.dtype != dst.dtype
           for src, dst in zip(results, outs)):
        # an out of another dtype that no meta kernel refused (bitwise_not's, isin's,
        # geqrf's CPU kernels want the exact dtype): CPU decides, once per signature
        cpu = cpu_verdict(op, args, kwargs, limit=_ASK_BYTES)
        if cpu is not None:
            raise cpu
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


# ---------------------------------------------------------------- CPU's verdict
# A stand-in storage up to this size is zeros; a larger one is torch.empty, whose pages
# the OS maps only when written, and a CPU kernel that refuses its input writes nothing.
_ZEROED_BYTES = 64 << 20
# A question whose answer is mostly "accepts" (aliasing, a lowering's refusal) runs the
# op on CPU then: calls whose stand-ins would take more are not asked, and keep tpu's
# answer (the aliasing check never refuses by guess).
_ASK_BYTES = 64 << 20
_NO_CPU_KERNEL = "Could not run '"  # the dispatcher's words: CPU has no kernel, no verdict
_ALIASING = "to a single memory location"  # TensorIterator's and assert_no_overlap's words
_ALIAS_OK: set = set()  # aliasing signatures CPU accepted
_OUT_NAMES: dict = {}


def cpu_verdict(op, args, kwargs, limit=None, scalars=False, ran=None):
    """What CPU raises for `op(*args, **kwargs)` run on stand-ins (host tensors of the
    same shapes, strides, offsets and dtypes, views of one host storage where the tpu
    tensors share one, zeros; a fresh generator): the exception, or None where CPU accepts
    the call, has no kernel for it, or (`limit`) its stand-ins would take more bytes.
    `scalars`: 0-dim tensors carry their values (a refusal that depends on a value, such
    as masked_fill's of a complex value into integers; it reads the device, so only on the
    way to raising). `ran`: a list that gets True when CPU ran the call and accepted it."""
    storages: dict = {}  # id of a tpu storage -> (that storage, its host stand-in)
    # id of a tpu tensor -> (it, its stand-in): a tensor passed twice is one tensor on CPU
    # too (cat((x, y), out=x) resizes the input x with the out)
    tensors: dict = {}
    used = [0]

    def stand_in(t):
        if t.device.type == "cpu":
            return t.clone()  # a 0-dim CPU tensor: the op must not write the user's
        if t.device.type != "tpu":
            raise _NoStandIn
        if id(t) in tensors:
            return tensors[id(t)][1]
        st = t.untyped_storage()
        pair = storages.get(id(st))
        if pair is None:
            n = st.nbytes()
            used[0] += n
            if limit is not None and used[0] > limit:
                raise _NoStandIn
            host = (torch.zeros if n <= _ZEROED_BYTES else torch.empty)(n, dtype=torch.uint8)
            pair = storages[id(st)] = (st, host.untyped_storage())
        host = torch.empty(0, dtype=t.dtype).set_(pair[1], t.storage_offset(), t.shape, t.stride())
        if scalars and t.dim() == 0:
            host.copy_(t.detach().cpu())
        tensors[id(t)] = (t, host)
        return host

    try:
        cargs = [_tree.convert(v, stand_in, _CPU) for v in args]
        ckwargs = {k: _tree.convert(v, stand_in, _CPU) for k, v in kwargs.items()}
    except Exception:  # noqa: BLE001 - no faithful stand-in (too large, a view set_ refuses): no verdict
        return None
    for i, name in _generators(op):
        # a CPU kernel that accepts the call must not draw from CPU's default generator
        if i < len(cargs):
            cargs[i] = torch.Generator()
        else:
            ckwargs[name] = torch.Generator()
    metrics.count("refusals.cpu_verdicts")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*cargs, **ckwargs)
    except NotImplementedError as e:
        return None if _NO_CPU_KERNEL in str(e) else e
    except Exception as e:  # noqa: BLE001 - CPU's refusal is the verdict, whatever its class
        return e
    if ran is not None:
        ran.append(True)
    return None


class _NoStandIn(Exception):
    pass


_CPU = torch.device("cpu")


_GENERATORS: dict = {}


def _generators(op):
    """(position, name) of each Generator argument of `op`."""
    found = _GENERATORS.get(op)
    if found is None:
        found = _GENERATORS[op] = tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                                        if "Generator" in str(a.type))
    return found


def _call(plan, vals):
    """(args, kwargs) of a call given as schema-ordered values."""
    return vals[:plan.npos], {plan.names[i]: vals[i] for i in range(plan.npos, len(vals))}


def _storages(v, out):
    """The ids of the tpu storages of the tensors in `v` (each storage's Python object
    lives as long as it does: the ids are stable while the tensors are)."""
    if isinstance(v, torch.Tensor):
        if v.device.type == "tpu":
            out.add(id(v.untyped_storage()))
    elif isinstance(v, (list, tuple)):
        for x in v:
            _storages(x, out)
    return out


def _shares_storage(written, read) -> bool:
    """Whether a tensor an op writes shares its storage with one it reads."""
    mine = _storages(written, set())
    return bool(mine) and not mine.isdisjoint(_storages(read, set()))


def _inputs_of_out(op, args, kwargs):
    names = _OUT_NAMES.get(op)
    if names is None:
        names = _OUT_NAMES[op] = frozenset(a.name for a in op._schema.arguments if a.is_out)
    return [*args, *(v for k, v in kwargs.items() if k not in names)]


def _check_aliasing(op, args, kwargs) -> None:
    """A written tensor shares memory with one the op reads: CPU decides (see the top), once
    per layout and sharing of the arguments. tpu computes such a call from the values
    before the write, which is what CPU computes where it accepts one."""
    sig = (op, _alias_signature((args, kwargs), {}))
    if sig in _ALIAS_OK:
        return
    cpu = cpu_verdict(op, args, kwargs, limit=_ASK_BYTES)
    if isinstance(cpu, RuntimeError) and _ALIASING in str(cpu):
        raise cpu
    if len(_ALIAS_OK) > 4096:
        _ALIAS_OK.clear()
    _ALIAS_OK.add(sig)


def _alias_signature(v, groups):
    """The layout of each tensor, which storage it is (numbered in order of appearance),
    and the other values (their types where they don't hash)."""
    if isinstance(v, torch.Tensor):
        st = v.untyped_storage()
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, st.nbytes(),
                groups.setdefault(id(st), len(groups)),
                groups.setdefault(("tensor", id(v)), len(groups)))  # the same one twice
    if isinstance(v, dict):
        return tuple((k, _alias_signature(x, groups)) for k, x in sorted(v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_alias_signature(x, groups) for x in v)
    if isinstance(v, (int, float, complex, torch.Generator)) and not isinstance(v, bool):
        return type(v)  # a learning rate that changes each step asks CPU once
    try:
        hash(v)
    except TypeError:
        return type(v)
    return v
