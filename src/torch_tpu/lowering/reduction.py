"""Reductions (sums, means, extrema, statistics, norms, logical, per segment), scans and
histograms. Sorting and the order statistics built on it are in sorting.py.

Accumulation follows torch: integer and bool sums and products accumulate in int64,
bfloat16/float16 accumulate in float32 (torch's CPU and CUDA `acc_type`), and an explicit
`dtype=` casts the input before reducing. The executor casts results to torch's dtype.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .._runtime import jax_dtype
from .creation import _ramp
from .registry import aten, keyed_scalars, lowering

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


# ---------------------------------------------------------------- helpers
def _axes(x, dim, empty_means_all=True):
    """A reduction's `dim` argument as a sorted tuple of axes of `x`. None reduces every
    axis; so does [] for the `int[1]?` reductions (sum, mean, amax, ...), while the
    `int[]?` logical ones (any.dims, all.dims) treat [] as "reduce nothing"."""
    if x.ndim == 0:
        return ()
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(x.ndim)) if empty_means_all else ()
    return tuple(sorted({d % x.ndim for d in dim}))


def _axis(x, dim):
    """One dimension argument as an axis of `x` (0-dim tensors accept 0 and -1)."""
    return dim % max(x.ndim, 1)


def _count(x, axes):
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def _acc(x, dtype=None):
    """`x` in the dtype torch accumulates sums and products in."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.int64)
    if x.dtype in _LOW_PRECISION:
        return x.astype(jnp.float32)
    return x


def _float_acc(x, dtype=None):
    """`x` as floating point for statistics and norms (ints become float32, which is
    torch's default dtype; bf16/f16 compute in float32)."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating)):
        return x.astype(jnp.float32)
    if x.dtype in _LOW_PRECISION:
        return x.astype(jnp.float32)
    return x


def _is_float(x):
    return jnp.issubdtype(x.dtype, jnp.floating)


def _squeeze_unless(x, axis, keepdim):
    return x if keepdim else jnp.squeeze(x, axis)


# ---------------------------------------------------------------- sums and products
@lowering(aten.sum.default, aten.sum.dim_IntList)
def _sum(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(_acc(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.nansum.default)
def _nansum(self, dim=None, keepdim=False, *, dtype=None):
    x = _acc(self, dtype)
    if _is_float(x):
        x = jnp.where(jnp.isnan(x), 0, x)
    return jnp.sum(x, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.mean.default, aten.mean.dim)
def _mean(self, dim=None, keepdim=False, *, dtype=None):
    # torch refuses integer input without dtype=, so _float_acc only widens bf16/f16
    return jnp.mean(_float_acc(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.prod.default, aten.prod.dim_int)
def _prod(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.prod(_acc(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def _count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=_axes(self, dim), dtype=jnp.int64)


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def _any(self, dim=None, keepdim=False):
    return jnp.any(self != 0, axis=_axes(self, dim, empty_means_all=False), keepdims=keepdim)


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def _all(self, dim=None, keepdim=False):
    return jnp.all(self != 0, axis=_axes(self, dim, empty_means_all=False), keepdims=keepdim)


@lowering(aten.hash_tensor.default)
def _hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    # torch's one mode (0, the xor reduction): each element widened to its 64-bit type
    # (float64, or int64 with sign extension), its bits read as uint64
    if mode != 0:
        raise RuntimeError(f"Unknown hash_tensor mode: {mode}")
    wide = self.astype(jnp.float64 if jnp.issubdtype(self.dtype, jnp.floating) else jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    return jnp.bitwise_xor.reduce(bits, axis=_axes(self, dim), keepdims=keepdim)


# ---------------------------------------------------------------- extrema
# XLA's max/min reductions propagate NaN, as torch's do.
@lowering(aten.amax.default, aten.max.default)
def _amax(self, dim=None, keepdim=False):
    return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.amin.default, aten.min.default)
def _amin(self, dim=None, keepdim=False):
    return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.aminmax.default)
def _aminmax(self, *, dim=None, keepdim=False):
    axes = _axes(self, dim)
    return jnp.min(self, axis=axes, keepdims=keepdim), jnp.max(self, axis=axes, keepdims=keepdim)


def _arg_extreme(x, dim, keepdim, largest):
    """Index of the first maximum (minimum) along `dim`, NaN counting as the extreme like
    torch; dim=None indexes the flattened tensor."""
    find = jnp.argmax if largest else jnp.argmin
    if dim is None or x.ndim == 0:
        return find(x.reshape(-1))  # the executor reshapes to torch's keepdim shape
    return find(x, axis=_axis(x, dim), keepdims=keepdim)


@lowering(aten.argmax.default)
def _argmax(self, dim=None, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=True)


@lowering(aten.argmin.default)
def _argmin(self, dim=None, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=False)


def _extreme_dim(x, dim, keepdim, largest):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(x, dim)
    idx = _arg_extreme(x, axis, True, largest)
    values = jnp.take_along_axis(x, idx, axis=axis)
    return _squeeze_unless(values, axis, keepdim), _squeeze_unless(idx, axis, keepdim)


@lowering(aten.max.dim)
def _max_dim(self, dim, keepdim=False):
    return _extreme_dim(self, dim, keepdim, largest=True)


@lowering(aten.min.dim)
def _min_dim(self, dim, keepdim=False):
    return _extreme_dim(self, dim, keepdim, largest=False)


# ---------------------------------------------------------------- statistics
def _inexact_only(x, message):
    """torch rejects integer input here (its meta kernels do not, so the lowering does)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(message)


def _var(x, axes, correction, keepdim):
    """Two-pass variance with torch's divisor max(0, N - correction) (correction=None is 1);
    complex input gives the real variance of |x - mean|."""
    _inexact_only(x, "std and var only support floating point and complex dtypes")
    x = _float_acc(x)
    centered = x - jnp.mean(x, axis=axes, keepdims=True)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        sq = centered.real * centered.real + centered.imag * centered.imag
    else:
        sq = centered * centered
    c = 1 if correction is None else correction
    return jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(_count(x, axes) - c, 0)


@lowering(aten.var.correction)
def _var_op(self, dim=None, *, correction=None, keepdim=False):
    return _var(self, _axes(self, dim), correction, keepdim)


@lowering(aten.std.correction)
def _std_op(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(self, _axes(self, dim), correction, keepdim))


@lowering(aten.var_mean.correction)
def _var_mean(self, dim=None, *, correction=None, keepdim=False):
    axes = _axes(self, dim)
    return _var(self, axes, correction, keepdim), jnp.mean(_float_acc(self), axis=axes, keepdims=keepdim)


@lowering(aten.std_mean.correction)
def _std_mean(self, dim=None, *, correction=None, keepdim=False):
    axes = _axes(self, dim)
    std = jnp.sqrt(_var(self, axes, correction, keepdim))
    return std, jnp.mean(_float_acc(self), axis=axes, keepdims=keepdim)


@lowering(aten.logsumexp.default)
def _logsumexp(self, dim, keepdim=False):
    # jax's logsumexp keeps torch's edge cases: an inf maximum gives inf, all -inf gives -inf
    return jax.nn.logsumexp(_float_acc(self), axis=_axes(self, dim), keepdims=keepdim)


# ---------------------------------------------------------------- norms
def _two_norm(axes, keepdim):
    """sqrt(sum(a^2)), with tiny inputs scaled up first: XLA flushes subnormal floats to
    zero, so squares of float32 values below ~1e-19 vanish where torch's kernels keep
    them as subnormals, and x / x.norm() on such tiny activations became inf (ALIGN).
    Large inputs overflow to inf as torch's do."""
    def fn(a):
        m = jnp.max(a, axis=axes, keepdims=True, initial=0.0)
        s = jnp.where((m > 0) & (m < 2.0 ** -60), m, 1.0).astype(a.dtype)
        r = s * jnp.sqrt(jnp.sum(jnp.square(a / s), axis=axes, keepdims=True))
        return r if keepdim else jnp.squeeze(r, axis=axes)

    return fn


def _vector_norm(x, ord, axes, keepdim):
    """sum(|x|^ord)^(1/ord) with torch's special orders inf, -inf and 0. `ord` is a
    Scalar: a common one (SCALAR_KEYED) is a Python number, whose case is picked here;
    another may be a traced value, and the special cases are a `lax.switch`."""
    a = jnp.abs(x)
    if a.dtype in _LOW_PRECISION:
        a = a.astype(jnp.float32)

    def reduce(fn, v, **kw):
        return fn(v, axis=axes, keepdims=keepdim, **kw)

    branches = [
        # `initial` keeps empty inputs traceable; |x| >= 0 makes it exact for max
        lambda a: reduce(jnp.max, a, initial=0.0),
        lambda a: reduce(jnp.min, a, initial=jnp.inf),
        lambda a: reduce(jnp.sum, (a != 0).astype(a.dtype)),
        lambda a: reduce(jnp.sum, a),
        _two_norm(axes, keepdim),
        lambda a: reduce(jnp.sum, a ** ord) ** (1.0 / ord),
    ]
    if not isinstance(ord, jax.core.Tracer):
        special = {float("inf"): 0, float("-inf"): 1, 0: 2, 1: 3, 2: 4}
        return branches[special.get(ord, 5)](a)
    index = jnp.select([ord == jnp.inf, ord == -jnp.inf, ord == 0, ord == 1, ord == 2],
                       [0, 1, 2, 3, 4], 5)
    return lax.switch(index, branches, a)


@lowering(aten.linalg_vector_norm.default)
@keyed_scalars("ord")
def _linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(jax_dtype(dtype)) if dtype is not None else self
    return _vector_norm(x, ord, _axes(self, dim), keepdim)


@lowering(aten.renorm.default)
def _renorm(self, p, dim, maxnorm):
    """Each slice along `dim` whose p-norm exceeds maxnorm is scaled down to it, by
    maxnorm / (norm + 1e-7) as torch's kernel does."""
    axes = tuple(i for i in range(self.ndim) if i != dim % max(self.ndim, 1))
    norm = _vector_norm(self, p, axes, True)
    scale = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return (self * scale.astype(self.dtype)).astype(self.dtype)


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype,
          aten.norm.ScalarOpt_dtype)
def _norm(self, p=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(jax_dtype(dtype)) if dtype is not None else self
    return _vector_norm(x, 2 if p is None else p, _axes(self, dim), keepdim)


# ---------------------------------------------------------------- scans
@lowering(aten.cumsum.default)
def _cumsum(self, dim, *, dtype=None):
    x = _acc(self, dtype)
    return x if x.ndim == 0 else jnp.cumsum(x, axis=_axis(x, dim))


@lowering(aten.cumprod.default)
def _cumprod(self, dim, *, dtype=None):
    x = _acc(self, dtype)
    return x if x.ndim == 0 else jnp.cumprod(x, axis=_axis(x, dim))


def _complex_logaddexp(a, b):
    """log(exp(a) + exp(b)) for complex a, b, shifted by the larger real part."""
    m = jnp.maximum(a.real, b.real)
    m = jnp.where(jnp.isfinite(m), m, 0)
    return m + jnp.log(jnp.exp(a - m) + jnp.exp(b - m))


@lowering(aten.logcumsumexp.default, aten._logcumsumexp.default)
def _logcumsumexp(self, dim):
    _inexact_only(self, f"logcumsumexp: not implemented for '{self.dtype}' (torch has no "
                        f"integer kernel on CPU or CUDA)")
    x = _float_acc(self)
    if x.ndim == 0:
        return x
    if jnp.iscomplexobj(x):  # lax.cumlogsumexp is real-only
        return lax.associative_scan(_complex_logaddexp, x, axis=_axis(x, dim))
    return lax.cumlogsumexp(x, axis=_axis(x, dim))


def _cum_extreme(x, dim, largest):
    """Running max/min with torch's indices: a later element wins ties (torch compares
    with >= / <=) and a NaN, once seen, wins over every number. That is the maximum
    under a total order, hence associative, so it runs as a parallel scan."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(x, dim)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)

    def combine(earlier, later):
        (ev, ei), (lv, li) = earlier, later
        beats = lv >= ev if largest else lv <= ev
        take_later = jnp.isnan(lv) | (~jnp.isnan(ev) & beats) if _is_float(x) else beats
        return jnp.where(take_later, lv, ev), jnp.where(take_later, li, ei)

    return lax.associative_scan(combine, (x, idx), axis=axis)


@lowering(aten.cummax.default)
def _cummax(self, dim):
    return _cum_extreme(self, dim, largest=True)


@lowering(aten.cummin.default)
def _cummin(self, dim):
    return _cum_extreme(self, dim, largest=False)


# ---------------------------------------------------------------- segment_reduce
def _segments(data, lengths, offsets, axis):
    """-> (data as (rows, inner), segment id per row, number of segments, lengths):
    the batch dims before `axis` each have their own segments (lengths is
    data.shape[:axis] + (S,)), numbered batch-major. Rows past a batch's last segment get
    the out-of-range id, which the segment ops drop."""
    if offsets is None:
        offsets = jnp.concatenate(
            [jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype), jnp.cumsum(lengths, axis=-1)],
            axis=-1)
    batch = data.shape[:axis]
    nb, size, count = math.prod(batch), data.shape[axis], offsets.shape[-1] - 1
    bounds = offsets.reshape(nb, count + 1)
    rows = jnp.arange(size, dtype=bounds.dtype)
    seg = jax.vmap(lambda b: jnp.searchsorted(b, rows, side="right") - 1)(bounds)
    seg = jnp.where((seg >= 0) & (seg < count), seg + count * jnp.arange(nb)[:, None],
                    nb * count)
    flat = data.reshape(nb * size, math.prod(data.shape[axis + 1:]))
    lengths = jnp.diff(bounds, axis=-1).reshape(-1)
    return flat, seg.reshape(-1), nb * count, lengths


# reduce -> (the segment reduction, how `initial` joins its result)
_SEGMENT_OPS = {"sum": (jax.ops.segment_sum, jnp.add), "mean": (jax.ops.segment_sum, jnp.add),
                "prod": (jax.ops.segment_prod, jnp.multiply),
                "max": (jax.ops.segment_max, jnp.maximum),
                "min": (jax.ops.segment_min, jnp.minimum)}


@lowering(aten.segment_reduce.default)
def _segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                    unsafe=False, initial=None):
    """torch's segment_reduce: `initial` starts every segment (max/min/sum/prod) or is
    added to the sum before dividing (mean); an empty segment gives `initial`, else the
    reduction's identity (NaN for mean). NaN wins max and min."""
    axis = _axis(data, axis)
    x = _float_acc(data)
    flat, seg, n, counts = _segments(x, lengths, offsets, axis)
    segment_op, join = _SEGMENT_OPS[reduce]
    out = segment_op(flat, seg, n)
    if reduce in ("max", "min"):
        out = jnp.where(jax.ops.segment_max(jnp.isnan(flat), seg, n), jnp.nan, out)
    if initial is not None:
        out = join(initial, out)
    if reduce == "mean":
        c = counts[:, None]
        empty = jnp.nan if initial is None else initial
        out = jnp.where(c > 0, out / jnp.maximum(c, 1), empty)
    shape = (lengths if lengths is not None else offsets[..., 1:]).shape
    return out.reshape(shape + data.shape[axis + 1:])


@lowering(aten._segment_reduce_backward.default)
def _segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0,
                             initial=None):
    """Sum and mean spread the gradient (mean divides by the length); max and min share it
    among the elements equal to the result; prod divides result by element, and for a
    zero or NaN element takes the product of the others (and `initial`) instead."""
    axis = _axis(data, axis)
    x = _float_acc(data)
    flat, seg, n, counts = _segments(x, lengths, offsets, axis)
    inner = flat.shape[1]

    def per_row(v):  # a per-segment (n, inner) value at every row; 0 past the segments
        return jnp.take(v.reshape(n, inner), seg, axis=0, mode="fill", fill_value=0)

    grad = _float_acc(grad).reshape(n, inner)
    g = per_row(grad)
    if reduce == "sum":
        out = g
    elif reduce == "mean":
        out = per_row(grad / jnp.maximum(counts, 1)[:, None])
    elif reduce in ("max", "min"):
        y = per_row(_float_acc(output))
        hit = (flat == y) | (jnp.isnan(flat) & jnp.isnan(y))
        ties = jax.ops.segment_sum(hit.astype(flat.dtype), seg, n)
        out = jnp.where(hit, per_row(grad / jnp.maximum(ties, 1)), 0)
    else:
        zero, nan = flat == 0, jnp.isnan(flat)
        special = zero | nan
        rest = jax.ops.segment_prod(jnp.where(special, 1, flat), seg, n)
        if initial is not None:
            rest = rest * initial
        zeros = per_row(jax.ops.segment_sum(zero.astype(jnp.int32), seg, n)) - zero
        nans = per_row(jax.ops.segment_sum(nan.astype(jnp.int32), seg, n)) - nan
        others = jnp.where(nans > 0, jnp.nan, jnp.where(zeros > 0, 0, per_row(rest)))
        y = per_row(_float_acc(output))
        out = jnp.where(special, g * others, g * y / jnp.where(special, 1, flat))
    return out.reshape(data.shape)


# ---------------------------------------------------------------- histograms
@lowering(aten.histc.default)
def _histc(self, bins=100, min=0, max=0):
    """torch.histc: equal-width bins over [min, max]; min == max == 0 means the data's range,
    and an empty range widens by 1 on each side, as torch's CPU kernel does. MoE routers
    (Mixtral) count tokens per expert with it."""
    x = jnp.ravel(self)
    ct = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    x = x.astype(ct)
    use_data = (min == 0) & (max == 0)
    lo = jnp.where(use_data, jnp.min(x, initial=jnp.inf), min).astype(ct)
    hi = jnp.where(use_data, jnp.max(x, initial=-jnp.inf), max).astype(ct)
    empty = lo == hi
    lo, hi = jnp.where(empty, lo - 1, lo), jnp.where(empty, hi + 1, hi)
    pos = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int64)
    pos = jnp.where(x == hi, bins - 1, pos)
    inside = (x >= lo) & (x <= hi)
    return jnp.zeros((bins,), ct).at[jnp.where(inside, pos, bins)].add(1, mode="drop")


@lowering(aten.bincount.default)
def _bincount(self, weights=None, minlength=0):
    """The result's length is max(self) + 1: a concrete value, so this runs eagerly (the
    executor's data-dependent path). torch counts in int64, and sums float32 weights in
    float32, every other weight dtype in double."""
    length = max(int(jnp.max(self, initial=-1)) + 1, minlength)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[self].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros((length,), dtype).at[self].add(weights.astype(dtype))


def _samples(self, dims):
    """histogramdd's samples: the last dim holds the coordinates."""
    return self.reshape(math.prod(self.shape[:-1]) if dims else self.size, max(dims, 1))


def _outer_edges(x, bins, range):
    """torch's histogram bin edges per dim: `bins` equal bins over `range`, or over the
    data's [min, max] per dim ([0, 1] without data) in double; an empty range widens by
    0.5 on each side (numpy's rules). The edges are a linspace in the input's dtype."""
    if range is not None:
        lo = jnp.asarray(range[0::2], jnp.float64)
        hi = jnp.asarray(range[1::2], jnp.float64)
    elif x.shape[0] == 0:
        lo, hi = jnp.zeros((x.shape[1],), jnp.float64), jnp.ones((x.shape[1],), jnp.float64)
    else:
        lo = jnp.min(x, axis=0).astype(jnp.float64)
        hi = jnp.max(x, axis=0).astype(jnp.float64)
    empty = lo == hi
    lo, hi = jnp.where(empty, lo - 0.5, lo), jnp.where(empty, hi + 0.5, hi)
    return [_ramp(lo[d], hi[d], n + 1, x.dtype) for d, n in enumerate(bins)]


def _histogramdd(x, edges, weight, density, linear):
    """Count (or sum `weight` of) the samples x (N, D) into the bins that `edges` (one
    sorted vector per dim) bound. Bins are [e[i], e[i + 1]), the last one closed; samples
    outside (and NaN) count nowhere. `linear` edges are equally spaced: torch then
    estimates the bin by division and corrects it by a search of the neighbouring edges
    (LINEAR_INTERPOLATION_WITH_LOCAL_SEARCH), which this reproduces."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    inside = jnp.ones(x.shape[:1], jnp.bool_)
    flat = jnp.zeros(x.shape[:1], jnp.int64)
    for d, (e, n) in enumerate(zip(edges, shape)):
        v = x[:, d].astype(e.dtype)
        inside = inside & (v >= e[0]) & (v <= e[-1])
        if linear:
            guess = jnp.where(inside, (v - e[0]) * n / (e[-1] - e[0]), 0).astype(jnp.int64)
            first = jnp.maximum(guess - 1, 0)
            stop = jnp.minimum(guess + 2, n + 1)
            below = sum(((first + k < stop) & (jnp.take(e, first + k, mode="clip") <= v))
                        for k in range(3))
            pos = first + below - 1
        else:
            pos = jnp.searchsorted(e, v, side="right") - 1
        flat = flat * n + jnp.where(pos == n, n - 1, pos)  # the last bin includes its end
    w = jnp.ones(x.shape[:1], x.dtype) if weight is None else weight.reshape(-1)
    size = math.prod(shape)
    hist = jnp.zeros((size,), w.dtype).at[jnp.where(inside, flat, size)].add(
        w, mode="drop").reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            hist = hist / jnp.diff(e).reshape((-1,) + (1,) * (len(edges) - 1 - d))
    return hist


@lowering(aten.histogram.bin_ct)
def _histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    x = self.reshape(-1, 1)
    edges = _outer_edges(x, [bins], range)
    return _histogramdd(x, edges, weight, density, linear=True), edges[0]


@lowering(aten.histogram.bins_tensor)
def _histogram_bins_tensor(self, bins, *, weight=None, density=False):
    return _histogramdd(self.reshape(-1, 1), [bins], weight, density, linear=False), bins


@lowering(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _outer_edges(_samples(self, len(bins)), bins, range)


@lowering(aten._histogramdd_from_bin_cts.default)
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    x = _samples(self, len(bins))
    return _histogramdd(x, _outer_edges(x, bins, range), weight, density, linear=True)


@lowering(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _histogramdd(_samples(self, len(bins)), bins, weight, density, linear=False)
