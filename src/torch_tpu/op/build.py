"""A new (op, key)'s entry: the traceable JAX body that reads each input's view out of its
flat buffer, runs the lowering, casts the results to torch's dtypes and lays each out in
its buffer in the meta kernel's memory order, writes mutated views back into their
buffers; and the one jit of it (op/opcall.py's module doc has the rules; OpPlan.compile
runs torch's checks first)."""
from __future__ import annotations

import time

import jax

from .. import _C, _jax_internals, _runtime, _storage, metrics
from ..lowering.registry import bounds_of
from ..lowering.schema import (GENERATOR, OPT_TENSOR, OPT_TENSOR_LIST, SCALAR, SCALAR_KEYED,
                               SCALAR_LIST, STATIC, STATIC_NUMBER, TENSOR_LIST)
from . import asserts, meta


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


def entry(plan, key, vals):
    """The entry of a new key (OpPlan.compile's work once torch's own checks passed): the
    meta kernel's result specs, the traceable body, one jit, traced now."""
    t0 = time.perf_counter()
    parts = key[1]
    specs = meta.run(plan, vals)
    mut_slots = []
    for i in plan.mutable:
        v = vals[i]
        if isinstance(v, (list, tuple)):
            mut_slots.extend((i, j) for j in range(len(v)))
        elif v is not None:
            mut_slots.append((i, None))
    spec = bounds_of(plan.lowering)  # index arguments: a device-side assert (asserts.py)
    checks = asserts.declare(spec, vals)
    fn = traceable(plan, parts, mut_slots, key[2] if len(key) > 2 else None,
                   spec if checks is not None else None)
    if specs is NotImplemented and not _traceable_shapes(fn, parts, plan):
        # data-dependent result shapes (nonzero, masked_select, bool-mask indexing):
        # no single XLA program exists; run the lowering op by op on concrete arrays.
        metrics.count("dynamic_shape_ops")
        return Entry(None, None, None, mut_slots, fn)
    if specs is NotImplemented:
        # no meta kernel: take shapes from JAX, dtypes mapped back to torch's
        bufs_abs, dyns_abs = _abstract_inputs(parts, plan)
        shapes = jax.eval_shape(lambda b, d: fn(b, d, None)[0], bufs_abs, dyns_abs)
        fresh = [(tuple(s.shape), _runtime.torch_dtype(s.dtype), None) for s in shapes]
        perms = [None] * len(fresh)
        structure = tuple(("fresh",) for _ in fresh) if plan.nrets else ()
    else:
        fresh, perms, structure = meta.describe(plan, specs)
    dtypes = [_runtime.jax_dtype(d) for _, d, _ in fresh]
    shapes = [s for s, _, _ in fresh]

    nbufs = _count_bufs(parts, plan)

    def run(*flat):
        return fn(flat[:nbufs], flat[nbufs:], (shapes, dtypes, perms))[1]

    jitted = jax.jit(run)
    # trace the body now, for its shapes and the arguments it uses: a lowering that
    # refuses the input raises at the call (DeferAndFuse would trace it first at its
    # next flush). It adds a few percent to a new key's compile (~3.5% measured over a
    # mix of small ops).
    traced = jitted.trace(*[a for group in _abstract_inputs(parts, plan) for a in group],
                          *(asserts.LINK_SHAPES if checks is not None else ()))
    metrics.count("op_entries")
    metrics.compile_seconds[0] += time.perf_counter() - t0
    made = Entry(jitted, fresh, structure, mut_slots)
    made.out_avals = traced.out_info
    made.kept = _jax_internals.kept_arguments(traced.jaxpr)
    made.raw = run  # the traceable body, for fusing into a larger graph
    made.key = key
    made.checks = checks
    return made


def traceable(plan, parts, mut_slots, shared=None, bounds=None):
    """(bufs, dyns, out specs) -> (raw results, flat buffers to store). With `bounds`,
    the lowering's index-bounds spec, dyns end with the device-side asserts' chain
    value, and the buffers with the chain's new value (op/asserts.py).

    `shared[b]` is the first buffer index holding the same storage as buffer b (None
    when no two arguments share one): a mutation of such a storage is written onto the
    result of the previous one, so that the last buffer stored holds every write."""
    kinds, names, npos, lowering, seeded = plan.kinds, plan.names, plan.npos, plan.lowering, plan.seeded
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
                f"lowering of {plan.name} returned {len(raw)} results, expected "
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
    if _C.slot():  # (its eager jnp ops make their arrays on JAX's default device)
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
