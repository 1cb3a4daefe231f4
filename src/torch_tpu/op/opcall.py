"""One aten op call turned into a cached, jitted JAX function: the part all eager modes
share.

`OpPlan` holds what is fixed per overload: argument kinds from the schema, which
arguments are mutated, the lowering. `OpPlan.scan` turns one call's arguments into a
cache key (shapes, strides, dtypes, static values, scalar *types*), the storages' flat XLA
buffers and the dynamic scalars. `OpPlan.compile` builds the entry for a new key: torch's
meta kernel gives result shapes, dtypes and memory layouts (and torch's own error for bad
input), and the JAX function reads each input's view out of its buffer, runs the lowering,
casts the results to torch's dtypes, lays each out in its flat buffer in the meta
kernel's memory order and writes mutated views back into their buffers. Scalars stay
traced arguments, so a changing learning rate does not recompile.

Layouts: like CPU and CUDA (TensorIterator, SDPA), a result keeps its input's layout when
the meta kernel says so: `x.transpose(1, 2) * 2` has the transposed strides, so
`.transpose(1, 2).view(B, S, -1)` works as it does on CPU. A result whose meta strides
are a dense permutation of its shape gets those strides (its buffer is written in that
order); any other layout (expanded, overlapping) is contiguous.
"""
from __future__ import annotations

import copy

import time
from typing import NamedTuple

import jax
import torch

from .. import _C, _config, _jax_internals, _precision, _runtime, _storage, metrics
from .._rng import default_generator, draw
from ..lowering.registry import bounds_of
from ..lowering.schema import (GENERATOR, OPT_TENSOR, OPT_TENSOR_LIST, SCALAR, SCALAR_KEYED,
                               SCALAR_LIST, STATIC, STATIC_NUMBER, TENSOR_LIST, OpSchema, keyed)
from . import asserts, current, refusals
from . import meta as meta_results


_SCALARS: dict = {}
_slot = _C.slot


def device_scalar(v):
    """A Python number as a weakly typed device scalar, cached by (type, value).

    jit converts a Python scalar argument into a new device buffer on every call (~7 us);
    a cached weak-typed array promotes exactly like the Python number and costs nothing.
    Learning rates change every step, so the cache is bounded."""
    slot = _slot()  # (several devices per process: each its own scalars; C scans tpu:0's)
    k = (type(v), v) if not slot else (type(v), v, slot)
    a = _SCALARS.get(k)
    if a is None:
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
        a = _SCALARS[k] = _runtime.scalar_to_device(v)
    return a


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _python_scan(plan, vals):
    return None


# TORCH_TPU_C_FAST_PATH=0: no C copy of a Python mechanism runs, only the reference (this
# scan, and the executors' execute for every op: modes.py keeps the op kernels from
# recording in C), so tests can run both and compare
C_FAST_PATH = _config.get("TORCH_TPU_C_FAST_PATH")
# (plan, vals) -> OpPlan.scan's result, or None: see OpPlan.scan
scan_fast = _C.scan if C_FAST_PATH else _python_scan
# (plan, args, kwargs) -> vals: the argument values in schema order, defaults filled in
normalize = _C.normalize
_C.scan_setup(_storage.ATTR, _SCALARS, device_scalar, _storage.DYNAMIC, _runtime.TORCH_TO_JAX)


class CSpec(NamedTuple):
    """What csrc/scan.cpp and csrc/kernel.cpp read of a plan, by position (the field order
    is _C.CONTRACTS["cspec"])."""
    kinds: tuple        # lowering/schema.py's argument kinds
    mutated: tuple      # indices of the arguments the op writes
    python_only: bool   # only OpPlan.scan handles it (seeded ops)
    npos: int           # how many arguments are positional
    names: tuple        # every argument's name
    defaults: tuple     # every argument's default (None where it has none)
    factory: bool       # no tensor argument: the key ends with torch.get_default_dtype()


class DeviceMismatchError(RuntimeError):
    pass


def _own_device() -> str:
    return "tpu:%d" % _C.current_index()  # the op's device (docs/DEVICES.md)


class Entry:
    """A compiled (op, key): the jitted function and how its results become tensors."""

    __slots__ = ("fn", "fresh", "structure", "mut_slots", "eager_fn", "out_recs", "raw", "key",
                 "checks", "out_avals", "kept", "ahead")

    def __init__(self, fn, fresh, structure, mut_slots, eager_fn=None):
        self.eager_fn = eager_fn    # set instead of fn for data-dependent shapes
        # asserts.Checks of an op with index arguments: fn and raw take the asserts'
        # chain value as their last argument and return its new value last
        self.checks = None
        # (length, jax dtype) of each fresh output's flat buffer
        self.out_recs = None if fresh is None else [
            (_prod(shape), _runtime.jax_dtype(dt)) for shape, dt, _ in fresh]
        self.raw = None
        self.key = None
        # Strict's compile window: the jax avals of what raw returns, and per argument of
        # raw whether its program keeps it (_jax_internals.kept_arguments)
        self.out_avals = None
        self.kept = None
        # until its first call compiles it: (args, like fn's) -> start that compile on a
        # worker thread (_program_cache.op_entry)
        self.ahead = None
        self.fn = fn                # (bufs, dyns) -> [fresh flat buffers..., new buffers of mutated storages...]
        # [(shape, torch dtype, strides or None for contiguous)] of the new tensors
        self.fresh = fresh
        self.structure = structure  # per schema return: ("alias", i) | ("fresh",) | ("list", n)
        self.mut_slots = mut_slots  # [(arg index, list index or None)] of mutated tensors


class OpPlan(OpSchema):
    """The schema's facts (lowering/schema.py), the per-key cache, and the scan and
    compile steps of the eager hot path."""

    __slots__ = ("cache", "host_indices", "cspec", "precision", "devices", "held", "apart")

    def __init__(self, op, lowering):
        super().__init__(op, lowering)
        self.cache = {}
        # like CUDA, advanced indexing of a device tensor takes index tensors on the host
        self.host_indices = op._schema.name in _HOST_INDEX_OPS
        self.cspec = CSpec(self.kinds, self.mutable, self.seeded, self.npos, self.names,
                           self.defaults, self.factory)
        # a precision-sensitive op's cache is keyed (key, this snapshot): in C too (kernel.cpp)
        self.precision = _precision.snapshot if lowering in _precision.SENSITIVE else None
        self.devices = None  # index -> this op's plan on tpu:index (on_device)
        self.held = {}  # calls on held tensors, made in C at the capacity (op/capacity.py)
        # not pointwise: its own kernel in XLA's program, what a long graph's compile time
        # is made of (DeferAndFuse's compile-cost guard, eager/defer.py)
        self.apart = torch.Tag.pointwise not in op.tags

    def on_device(self, index: int) -> "OpPlan":
        """This op's plan for tpu:`index` of a process with several devices: the same
        facts with a cache of its own, so its keys (which start with the plan) and programs
        are that device's (csrc/kernel.cpp run_on_devices). tpu:0's is this plan."""
        if index == 0:
            return self
        if self.devices is None:
            self.devices = {}
        plan = self.devices.get(index)
        if plan is None:
            plan = self.devices[index] = copy.copy(self)
            plan.cache, plan.held = {}, {}
            plan.devices = None
        return plan

    def __repr__(self):
        # keys start with the plan (hashed by identity: OpOverload's hash is Python code),
        # and DeferAndFuse's messages print that first element as the op's name
        return str(self.op)

    # ------------------------------------------------------------ per call (hot path)
    def scan(self, vals):
        """-> (key, bufs, dyns): key = (this plan, one part per argument[, shared]).
        Tensors give their view spec, numbers their type.

        The executors call `scan_fast` (csrc/scan.cpp) first: the same key for the common
        case in C, None for what only this Python handles (first touch of a storage,
        other devices, conj/neg views, seeded ops, a storage written through two
        arguments)."""
        parts = []
        bufs = []
        dyns = []
        # in-place ops: every tensor's storage record, to find two written views of one
        # storage (`written`: their positions in recs)
        recs = [] if self.mutable else None
        written = []
        kinds = self.kinds
        gen = None
        for i, v in enumerate(vals):
            k = kinds[i]
            before = len(recs) if recs is not None else 0
            if k == STATIC:
                parts.append(_hashable(v))
            elif k <= OPT_TENSOR:
                parts.append(self._tensor_part(v, bufs, dyns, recs))
            elif k == STATIC_NUMBER:
                parts.append((type(v), v))
            elif k == SCALAR or k == SCALAR_KEYED:
                if v is None or isinstance(v, bool):
                    parts.append(("=", v))
                else:
                    if isinstance(v, torch.Tensor):
                        v = v.item()
                    if k == SCALAR_KEYED and keyed(v):
                        parts.append((type(v), v))  # a constant of the program
                    else:
                        parts.append(type(v))
                        dyns.append(device_scalar(v))
            elif k <= OPT_TENSOR_LIST:
                if self.host_indices:
                    v = _upload_indices(v)
                parts.append(tuple([self._tensor_part(t, bufs, dyns, recs) for t in v]))
            elif k == SCALAR_LIST:
                parts.append(tuple([type(x) for x in v]))
                dyns.extend([device_scalar(x) for x in v])
            else:
                gen = v
                parts.append(None)
            if recs is not None and i in self.mutable:
                written.extend(range(before, len(recs)))
        if self.seeded:
            if gen is None:
                gen = default_generator()
            elif gen.device.type != "tpu":
                raise RuntimeError(
                    f"{self.name}: expected a Generator on device tpu but got one on {gen.device}")
            dyns.extend(draw(gen))
        if self.factory:
            # dtype=None factories follow torch.get_default_dtype()
            parts.append(torch.get_default_dtype())
        if len(written) > 1:
            ids = [id(r) for r in recs]
            if len({ids[j] for j in written}) < len(written):
                # one storage written through several arguments (views of one storage, as
                # in _foreach_copy_ into slices of one flat buffer): the writes must chain.
                # (A storage written and also read through another argument needs nothing:
                # reads see the values from before the op.)
                first: dict = {}
                shared = tuple(first.setdefault(x, b) for b, x in enumerate(ids))
                return (self, tuple(parts), shared), bufs, dyns
        return (self, tuple(parts)), bufs, dyns

    def _tensor_part(self, t, bufs, dyns, recs=None):
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):  # a Python number torch passed for a Tensor
            dyns.append(device_scalar(t))
            return ("#", type(t))
        rec = getattr(t.untyped_storage(), _storage.ATTR, None)
        if rec is None:
            t, rec = self._first_touch(t)
        bufs.append(rec[0])
        if recs is not None:
            recs.append(rec)
        offset = t.storage_offset()
        if _storage.offset_is_data(t.shape, t.stride(), offset, rec[1], rec[2], t.dtype):
            dyns.append(device_scalar(offset))
            offset = _storage.DYNAMIC
        if t.is_conj() or t.is_neg():
            # torch's lazy conj()/_neg_view bits reach the ops that resolve them themselves
            # (copy_, clone, mm, dot, ...): the program applies them to what it reads
            return (t.shape, t.stride(), offset, t.dtype, rec[1], rec[2],
                    (t.is_conj(), t.is_neg()))
        return (t.shape, t.stride(), offset, t.dtype, rec[1], rec[2])

    def _first_touch(self, t):
        """A storage without a buffer: a fresh tpu storage, or a tensor of another device."""
        if t.device.type != "tpu":
            if t.dim() == 0 and t.device.type == "cpu":
                t = t.to("tpu")  # CUDA accepts 0-dim CPU tensors beside device tensors; so do we
            else:
                raise DeviceMismatchError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, {_own_device()} and {t.device}! (when checking argument for "
                    f"{self.name})")
        st = t.untyped_storage()
        rec = getattr(st, _storage.ATTR, None)  # set when t was just uploaded
        if rec is None:  # a fresh storage: zeros (DeferAndFuse records them, allocating nothing)
            rec = current.executor().constant(st, t.dtype)
        return t, rec

    # ------------------------------------------------------------ per new key
    def compile(self, key, vals):
        """The entry of a new key. Bad input raises here, at the call, in every mode:
        torch's rules (refusals.check_call), the meta kernel's, then the lowering's while
        it is traced for the key, as CPU's exception where CPU refuses the call too, else
        as torch's exception classes (refusals.torch_error)."""
        refusals.check_call(self, vals)  # raises CPU's exceptions already
        try:
            return self._compile(key, vals)
        except Exception as e:
            mapped = refusals.torch_error(self, e, vals)
            if mapped is None:
                raise
            raise mapped from e

    def _compile(self, key, vals):
        t0 = time.perf_counter()
        parts = key[1]
        meta = meta_results.run(self, vals)
        mut_slots = []
        for i in self.mutable:
            v = vals[i]
            if isinstance(v, (list, tuple)):
                mut_slots.extend((i, j) for j in range(len(v)))
            elif v is not None:
                mut_slots.append((i, None))
        spec = bounds_of(self.lowering)  # index arguments: a device-side assert (asserts.py)
        checks = asserts.declare(spec, vals)
        fn = self._traceable(parts, mut_slots, key[2] if len(key) > 2 else None,
                             spec if checks is not None else None)
        if meta is NotImplemented and not _traceable_shapes(fn, parts, self):
            # data-dependent result shapes (nonzero, masked_select, bool-mask indexing):
            # no single XLA program exists; run the lowering op by op on concrete arrays.
            metrics.count("dynamic_shape_ops")
            return Entry(None, None, None, mut_slots, fn)
        if meta is NotImplemented:
            # no meta kernel: take shapes from JAX, dtypes mapped back to torch's
            bufs_abs, dyns_abs = _abstract_inputs(parts, self)
            shapes = jax.eval_shape(lambda b, d: fn(b, d, None)[0], bufs_abs, dyns_abs)
            fresh = [(tuple(s.shape), _runtime.torch_dtype(s.dtype), None) for s in shapes]
            perms = [None] * len(fresh)
            structure = tuple(("fresh",) for _ in fresh) if self.nrets else ()
        else:
            fresh, perms, structure = meta_results.describe(self, meta)
        dtypes = [_runtime.jax_dtype(d) for _, d, _ in fresh]
        shapes = [s for s, _, _ in fresh]

        nbufs = _count_bufs(parts, self)

        def run(*flat):
            return fn(flat[:nbufs], flat[nbufs:], (shapes, dtypes, perms))[1]

        jitted = jax.jit(run)
        # trace the body now, for its shapes and the arguments it uses: a lowering that
        # refuses the input raises at the call (DeferAndFuse would trace it first at its
        # next flush). It adds a few percent to a new key's compile (~3.5% measured over a
        # mix of small ops).
        traced = jitted.trace(*[a for group in _abstract_inputs(parts, self) for a in group],
                              *(asserts.LINK_SHAPES if checks is not None else ()))
        metrics.count("op_entries")
        metrics.compile_seconds[0] += time.perf_counter() - t0
        entry = Entry(jitted, fresh, structure, mut_slots)
        entry.out_avals = traced.out_info
        entry.kept = _jax_internals.kept_arguments(traced.jaxpr)
        entry.raw = run  # the traceable body, for fusing into a larger graph
        entry.key = key
        entry.checks = checks
        return entry

    def _traceable(self, parts, mut_slots, shared=None, bounds=None):
        """(bufs, dyns, out specs) -> (raw results, flat buffers to store). With `bounds`,
        the lowering's index-bounds spec, dyns end with the device-side asserts' chain
        value, and the buffers with the chain's new value (op/asserts.py).

        `shared[b]` is the first buffer index holding the same storage as buffer b (None
        when no two arguments share one): a mutation of such a storage is written onto the
        result of the previous one, so that the last buffer stored holds every write."""
        kinds, names, npos, lowering, seeded = self.kinds, self.names, self.npos, self.lowering, self.seeded
        # which buffer index each tensor argument reads, to write mutations back
        buf_index = {}
        n = 0
        for i, (k, part) in enumerate(zip(kinds, parts)):
            if k <= OPT_TENSOR and part is not None and part[0] != "#":
                buf_index[(i, None)] = n
                n += 1
            elif k in (TENSOR_LIST, OPT_TENSOR_LIST):
                for j, p in enumerate(part):
                    if p is not None and p[0] != "#":
                        buf_index[(i, j)] = n
                        n += 1

        def read(part, bufs, b, dyns_it, offsets):
            if part is None:
                return None, b
            if part[0] == "#":
                return next(dyns_it), b
            shape, stride, offset, dtype, blen, bdt, *bits = part
            if offset == _storage.DYNAMIC:
                offset = offsets[b] = next(dyns_it)
            x = _storage.written(bufs[b], tuple(shape), tuple(stride), dtype, offset)
            if x is None:  # (not a view a write in this DeferAndFuse graph made: forward.py)
                x = _storage.reader(tuple(shape), tuple(stride), part[2], blen, bdt, dtype)(bufs[b], offset)
            return (_math_bits(x, *bits[0]) if bits else x), b + 1

        def fn(bufs, dyns, specs):
            dyns_it = iter(dyns)
            offsets = {}  # buffer index -> the offset passed as data, for the writes
            args = []
            b = 0
            for k, part in zip(kinds, parts):
                if k == STATIC:
                    args.append(part)
                elif k == STATIC_NUMBER:
                    args.append(part[1])
                elif k <= OPT_TENSOR:
                    x, b = read(part, bufs, b, dyns_it, offsets)
                    args.append(x)
                elif k == SCALAR or k == SCALAR_KEYED:
                    args.append(part[1] if isinstance(part, tuple) else next(dyns_it))
                elif k <= OPT_TENSOR_LIST:
                    xs = []
                    for p in part:
                        x, b = read(p, bufs, b, dyns_it, offsets)
                        xs.append(x)
                    args.append(xs)
                elif k == SCALAR_LIST:
                    args.append([next(dyns_it) for _ in part])
                else:
                    args.append(None)
            kw = {names[i]: args[i] for i in range(npos, len(args)) if kinds[i] != GENERATOR}
            if seeded:
                seed = next(dyns_it)
                offset = next(dyns_it)
                kw["generator"] = jax.random.fold_in(jax.random.key(seed), offset)
            raw = _flatten(lowering(*args[:npos], **kw))
            # gradients an output_mask leaves out come back as None, where torch's meta
            # kernel returns None too: they are not fresh results
            nmut = len(mut_slots)
            raw = [x for x in raw[:len(raw) - nmut] if x is not None] + raw[len(raw) - nmut:]
            if specs is None:
                return raw[:len(raw) - len(mut_slots)], None
            shapes, dtypes, perms = specs
            nfresh = len(shapes)
            if len(raw) != nfresh + len(mut_slots):
                raise RuntimeError(
                    f"lowering of {self.name} returned {len(raw)} results, expected "
                    f"{nfresh} new + {len(mut_slots)} mutated")
            out = []
            for x, shape, dt, perm in zip(raw[:nfresh], shapes, dtypes, perms):
                x = x.astype(dt) if x.dtype != dt else x
                if x.shape != shape:
                    x = x.reshape(shape) if x.size == _prod(shape) else jax.numpy.broadcast_to(x, shape)
                if perm is not None:  # the buffer in the result's memory order (meta._layout)
                    x = jax.numpy.transpose(x, perm)
                out.append(x.reshape(-1))
            latest = {}
            for (i, j), x in zip(mut_slots, raw[nfresh:]):
                part = parts[i] if j is None else parts[i][j]
                shape, stride, offset, dtype, blen, bdt, *bits = part
                w = _storage.writer(tuple(shape), tuple(stride), offset, blen, bdt, dtype)
                if x is None:
                    x = args[i] if j is None else args[i][j]
                x = jax.numpy.broadcast_to(x.astype(_runtime.jax_dtype(dtype)), tuple(shape))
                if bits:  # a write through a conj()/neg view stores the undone value
                    x = _math_bits(x, *bits[0])
                b = buf_index[(i, j)]
                off = offsets.get(b, offset)
                if shared is None:
                    new = w(bufs[b], x, off)
                else:
                    g = shared[b]
                    latest[g] = new = w(latest.get(g, bufs[b]), x, off)
                _storage.note_write(new, tuple(shape), tuple(stride), dtype, off, x)
                out.append(new)
            if bounds is not None:  # the asserts' chain: its value is the last dyn
                out.append(asserts.fold(dyns[-1], asserts.op_code(bounds(args))))
            return raw, out

        return fn


_HOST_INDEX_OPS = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
                   "aten::_unsafe_index", "aten::_unsafe_index_put"}


def _upload_indices(indices):
    return [t.to("tpu") if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t
            for t in indices]


def _math_bits(x, conj, neg):
    """The value of a view whose conj/neg bits are set, from its storage's (or the
    inverse: both are involutions)."""
    if conj:
        x = jax.numpy.conj(x)
    return -x if neg else x


def _count_bufs(parts, plan):
    n = 0
    for k, part in zip(plan.kinds, parts):
        ps = part if k in (TENSOR_LIST, OPT_TENSOR_LIST) else [part] if k <= OPT_TENSOR else []
        n += sum(1 for p in ps if p is not None and p[0] != "#")
    return n


def _traceable_shapes(fn, parts, plan):
    try:
        bufs_abs, dyns_abs = _abstract_inputs(parts, plan)
        jax.eval_shape(lambda b, d: fn(b, d, None)[0], bufs_abs, dyns_abs)
        return True
    except (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError,
            jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError):
        return False


def run_eager(plan, entry, vals, bufs, dyns):
    """Run a data-dependent-shape op on concrete arrays; returns (fresh specs, flat outs)."""
    if _slot():  # (its eager jnp ops make their arrays on JAX's default device)
        with jax.default_device(_runtime.device()):
            raw, _ = entry.eager_fn(bufs, dyns, None)
    else:
        raw, _ = entry.eager_fn(bufs, dyns, None)
    fresh = [(tuple(x.shape), _runtime.torch_dtype(x.dtype), None) for x in raw]
    outs = [x.reshape(-1) for x in raw]
    if entry.mut_slots:
        raise NotImplementedError(f"{plan.name}: in-place ops with data-dependent shapes")
    return fresh, outs


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _flatten(out):
    if isinstance(out, (tuple, list)):
        flat = []
        for o in out:
            if isinstance(o, (tuple, list)):
                flat.extend(o)
            else:
                flat.append(o)
        return flat
    return [out]


def _abstract_inputs(parts, plan):
    bufs, dyns = [], []
    for k, part in zip(plan.kinds, parts):
        ps = part if k in (TENSOR_LIST, OPT_TENSOR_LIST) else [part] if k <= OPT_TENSOR else []
        for p in ps:
            if p is None:
                continue
            if p[0] == "#":
                dyns.append(p[1]())
            else:
                bufs.append(jax.ShapeDtypeStruct((p[4],), p[5]))
                if p[2] == _storage.DYNAMIC:
                    dyns.append(0)
        if (k == SCALAR or k == SCALAR_KEYED) and not isinstance(part, tuple):
            dyns.append(part())
        if k == SCALAR_LIST:
            dyns.extend(t() for t in part)
    if plan.seeded:
        dyns.extend([0, 0])
    return bufs, dyns
