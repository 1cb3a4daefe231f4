"""Random sampling. Every op here is tagged nondeterministic_seeded, so the executor passes
`generator=`, a JAX key derived from the torch Generator's seed and offset: the same seed
gives the same numbers, and each call advances the generator.

The in-place methods (uniform_, bernoulli_, random_, exponential_, ...) derive from the
functional ops below; `rand`, `randn`, `randint` and the `*_like` factories are torch
composites over them (empty + uniform_/normal_/random_).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._dtypes import scalar_type_name
from .registry import aten, lowering


def _sample_dtype(dtype):
    """Transform samples in float32 at least, then round once to the result's dtype;
    integer and bool results compute in float32 too."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits >= 32:
        return dtype
    return jnp.float32


def _uniform01(key, shape, dtype):
    # drawn in the result's own float type, like torch (which fills only the mantissa
    # bits the type has): a bf16 rand() is then < 1 after rounding, never == 1
    draw = dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32
    return jax.random.uniform(key, shape, draw)


def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, _sample_dtype(dtype))


# ---------------------------------------------------------------- continuous distributions
@lowering(aten.uniform.default)
def _uniform(self, from_=0.0, to=1.0, *, generator):
    if isinstance(from_, (int, float)) and isinstance(to, (int, float)) and from_ > to:
        raise RuntimeError(  # CPU's check and words (its kernel's; the meta kernel has none)
            f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}")
    u = _uniform01(generator, self.shape, self.dtype).astype(_sample_dtype(self.dtype))
    return (from_ + (to - from_) * u).astype(self.dtype)


@lowering(aten.normal_functional.default, aten.normal_.default)
def _normal_functional(self, mean=0.0, std=1.0, *, generator):
    # normal_ has no functional twin the registry can match by schema (normal_functional is
    # named differently), so the in-place op is registered here directly
    return (mean + std * _normal(generator, self.shape, self.dtype)).astype(self.dtype)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _normal_tensors(mean=0.0, std=1.0, *, generator):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = next(x.dtype for x in (mean, std) if hasattr(x, "dtype"))
    return mean + std * _normal(generator, shape, dtype)


@lowering(aten.exponential.default)
def _exponential(self, lambd=1.0, *, generator):
    return (jax.random.exponential(generator, self.shape, _sample_dtype(self.dtype)) / lambd).astype(self.dtype)


@lowering(aten.cauchy.default)
def _cauchy(self, median=0.0, sigma=1.0, *, generator):
    return (median + sigma * jax.random.cauchy(generator, self.shape, _sample_dtype(self.dtype))).astype(self.dtype)


@lowering(aten.log_normal.default)
def _log_normal(self, mean=1.0, std=2.0, *, generator):
    return jnp.exp(mean + std * _normal(generator, self.shape, self.dtype)).astype(self.dtype)


@lowering(aten.geometric.default)
def _geometric(self, p, *, generator):
    # the number of Bernoulli(p) trials up to the first success: ceil(log(u) / log(1 - p))
    dtype = _sample_dtype(self.dtype)
    u = jax.random.uniform(generator, self.shape, dtype, minval=jnp.finfo(dtype).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(self.dtype)


# ---------------------------------------------------------------- bernoulli
def _bernoulli(key, shape, p, dtype):
    return (_uniform01(key, shape, jnp.float32) < p).astype(dtype)


@lowering(aten.bernoulli.p)
def _bernoulli_p(self, p=0.5, *, generator):
    return _bernoulli(generator, self.shape, p, self.dtype)


@lowering(aten.bernoulli.Tensor)
def _bernoulli_tensor(self, p, *, generator):
    return _bernoulli(generator, self.shape, jnp.broadcast_to(p, self.shape), self.dtype)


@lowering(aten.bernoulli.default)
def _bernoulli_self(self, *, generator):
    # torch.bernoulli(probs): each element is its own probability
    return _bernoulli(generator, self.shape, self, self.dtype)


# ---------------------------------------------------------------- integers
def _dtype_upper(dtype):
    """random_()'s inclusive upper bound: the largest integer the dtype holds exactly
    (2**mantissa bits for floats, the maximum for integers)."""
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)
    return int(jnp.iinfo(dtype).max)


def _randint(key, shape, low, high, dtype):
    """Integers in [low, high] (inclusive, static Python ints), like torch's
    `random() % range + base`: 64 random bits reduced modulo the range, in uint64 so the
    full int64 range does not overflow."""
    span = high - low + 1
    bits = jax.random.bits(key, shape, jnp.uint64)
    if span < 2 ** 64:
        bits = bits % np.uint64(span)
    wrapped = bits + np.uint64(low % 2 ** 64)
    value = lax.bitcast_convert_type(wrapped, jnp.int64)
    if dtype == jnp.bool_:
        return value != 0
    return value.astype(dtype)


@lowering(aten.random.default)
def _random(self, *, generator):
    return _randint(generator, self.shape, 0, _dtype_upper(self.dtype), self.dtype)


def _check_range(from_, to):
    if to is not None and from_ >= to:  # torch's random_from_to check, CPU's wording
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")


@lowering(getattr(aten.random, "from"))
def _random_from(self, from_, to, *, generator):
    _check_range(from_, to)
    high = _dtype_upper(self.dtype) if to is None else to - 1
    return _randint(generator, self.shape, from_, high, self.dtype)


@lowering(aten.random.to)
def _random_to(self, to, *, generator):
    _check_range(0, to)
    return _randint(generator, self.shape, 0, to - 1, self.dtype)


@lowering(aten.randperm.default, aten.randperm.generator)
def _randperm(n, *, generator, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(generator, n)


@lowering(aten.multinomial.default)
def _multinomial(self, num_samples, replacement=False, *, generator):
    # torch's meta kernel skips these checks of its CPU and CUDA kernels
    if not jnp.issubdtype(self.dtype, jnp.floating):
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{scalar_type_name(self.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if self.shape[-1] > 2 ** 24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    logits = jnp.log(self.astype(jnp.float32))
    if replacement:
        batch = logits.shape[:-1]
        draws = jax.random.categorical(generator, logits, axis=-1, shape=(num_samples,) + batch)
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    # without replacement: the top num_samples of logits + Gumbel noise are a draw in order
    # (the Gumbel-top-k trick); zero-probability entries (-inf) come last
    noisy = logits + jax.random.gumbel(generator, logits.shape, jnp.float32)
    return lax.top_k(noisy, num_samples)[1].astype(jnp.int64)
