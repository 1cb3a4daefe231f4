"""Random sampling and factories on tpu: distribution statistics, reproducibility under
torch.manual_seed and tpu Generators, and every factory against CPU; each in Strict and in
DeferAndFuse (the `eager` fixture)."""
import math

import pytest
import torch

TPU = "tpu"
N = 20000


def _stats(t):
    t = t.cpu().double()
    return t.mean().item(), t.std().item()


def _close(value, expected, tol):
    assert abs(value - expected) <= tol, (value, expected)


# ---------------------------------------------------------------- distributions
# name -> (sample on tpu, expected mean, expected std); tolerances are ~6 standard errors
DISTRIBUTIONS = {
    "rand": (lambda: torch.rand(N, device=TPU), 0.5, math.sqrt(1 / 12)),
    "rand_bf16": (lambda: torch.rand(N, device=TPU, dtype=torch.bfloat16), 0.5, math.sqrt(1 / 12)),
    "randn": (lambda: torch.randn(N, device=TPU), 0.0, 1.0),
    "randn_bf16": (lambda: torch.randn(N, device=TPU, dtype=torch.bfloat16), 0.0, 1.0),
    "randn_f64": (lambda: torch.randn(N, device=TPU, dtype=torch.float64), 0.0, 1.0),
    "uniform_": (lambda: torch.empty(N, device=TPU).uniform_(-2, 4), 1.0, 6 / math.sqrt(12)),
    "normal_": (lambda: torch.empty(N, device=TPU).normal_(3, 0.5), 3.0, 0.5),
    "normal_tensor_float": (lambda: torch.normal(torch.full((N,), -1.0, device=TPU), 2.0), -1.0, 2.0),
    "normal_float_tensor": (lambda: torch.normal(1.0, torch.full((N,), 0.5, device=TPU)), 1.0, 0.5),
    "normal_tensor_tensor": (lambda: torch.normal(torch.zeros(N, device=TPU),
                                                  torch.full((N,), 3.0, device=TPU)), 0.0, 3.0),
    "normal_float_float": (lambda: torch.normal(2.0, 1.5, (N,), device=TPU), 2.0, 1.5),
    "bernoulli_p": (lambda: torch.empty(N, device=TPU).bernoulli_(0.3), 0.3, math.sqrt(0.21)),
    "bernoulli_tensor_p": (lambda: torch.zeros(N, device=TPU).bernoulli_(
        torch.full((N,), 0.8, device=TPU)), 0.8, 0.4),
    "bernoulli_probs": (lambda: torch.bernoulli(torch.full((N,), 0.6, device=TPU)), 0.6,
                        math.sqrt(0.24)),
    "randint": (lambda: torch.randint(3, 9, (N,), device=TPU), 5.5, math.sqrt(35 / 12)),
    "random_to": (lambda: torch.empty(N, device=TPU, dtype=torch.int32).random_(10), 4.5,
                  math.sqrt(99 / 12)),
    "random_from_to": (lambda: torch.empty(N, device=TPU).random_(-3, 2), -1.0, math.sqrt(2)),
    "random_uint8": (lambda: torch.empty(N, device=TPU, dtype=torch.uint8).random_(), 127.5,
                     math.sqrt((256 ** 2 - 1) / 12)),
    "exponential_": (lambda: torch.empty(N, device=TPU).exponential_(2.0), 0.5, 0.5),
    "geometric_": (lambda: torch.empty(N, device=TPU).geometric_(0.25), 4.0, math.sqrt(0.75) / 0.25),
    "log_normal_": (lambda: torch.empty(N, device=TPU).log_normal_(0.0, 0.5),
                    math.exp(0.125), math.sqrt((math.exp(0.25) - 1) * math.exp(0.25))),
    "rand_like": (lambda: torch.rand_like(torch.empty(N, device=TPU)), 0.5, math.sqrt(1 / 12)),
    "randn_like": (lambda: torch.randn_like(torch.empty(N, device=TPU)), 0.0, 1.0),
    "randint_like": (lambda: torch.randint_like(torch.empty(N, device=TPU), 4), 1.5,
                     math.sqrt(15 / 12)),
}


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_distribution(eager, name):
    sample, mean, std = DISTRIBUTIONS[name]
    torch.manual_seed(0)
    t = sample()
    assert t.device.type == TPU and t.shape == (N,)
    m, s = _stats(t)
    _close(m, mean, 6 * std / math.sqrt(N) + 1e-3)
    _close(s, std, 0.05 * std)


RANGES = {
    # sample -> inclusive [low, high] that torch promises
    "rand": (lambda: torch.rand(N, device=TPU, dtype=torch.bfloat16), 0.0, 1.0 - 2 ** -8),
    "uniform_": (lambda: torch.empty(N, device=TPU).uniform_(5, 6), 5.0, 6.0),
    "randint": (lambda: torch.randint(-4, 3, (N,), device=TPU), -4, 2),
    "random_float": (lambda: torch.empty(N, device=TPU).random_(), 0, 2 ** 24),
    "random_int64": (lambda: torch.empty(N, device=TPU, dtype=torch.int64).random_(), 0, 2 ** 63 - 1),
    "random_int8_from": (lambda: torch.empty(N, device=TPU, dtype=torch.int8).random_(-100, None),
                         -100, 127),
    "random_bool": (lambda: torch.empty(N, device=TPU, dtype=torch.bool).random_(), 0, 1),
    "bernoulli_int": (lambda: torch.empty(N, device=TPU, dtype=torch.int64).bernoulli_(0.5), 0, 1),
    "geometric_": (lambda: torch.empty(N, device=TPU).geometric_(0.5), 1, math.inf),
    "exponential_": (lambda: torch.empty(N, device=TPU).exponential_(), 0, math.inf),
}


@pytest.mark.parametrize("name", list(RANGES))
def test_range(eager, name):
    sample, low, high = RANGES[name]
    t = sample().cpu()
    lo, hi = t.min().item(), t.max().item()
    assert low <= lo and hi <= high, (lo, hi)
    assert lo < hi  # not constant
    if not t.is_floating_point() or name.startswith("random"):
        assert torch.equal(t, t.round()) if t.is_floating_point() else True


def test_randperm(eager):
    torch.manual_seed(0)
    p = torch.randperm(50, device=TPU)
    assert p.dtype == torch.int64
    assert torch.equal(torch.sort(p.cpu())[0], torch.arange(50))
    assert not torch.equal(p.cpu(), torch.arange(50))
    assert torch.randperm(7, device=TPU, dtype=torch.int32).dtype == torch.int32


def test_multinomial_with_replacement_frequencies(eager):
    torch.manual_seed(0)
    probs = torch.tensor([[1.0, 2.0, 7.0], [5.0, 0.0, 5.0]], device=TPU)  # unnormalized
    draws = torch.multinomial(probs, N, replacement=True).cpu()
    assert draws.shape == (2, N) and draws.dtype == torch.int64
    freq0 = torch.bincount(draws[0], minlength=3).double() / N
    torch.testing.assert_close(freq0, torch.tensor([0.1, 0.2, 0.7], dtype=torch.double), atol=0.02,
                               rtol=0)
    assert (draws[1] != 1).all()  # zero probability is never drawn


def test_multinomial_without_replacement(eager):
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 1.0, 1.0, 8.0, 0.0, 2.0], device=TPU)
    # each draw is read at once, as a sampling loop does: DeferAndFuse would otherwise
    # record all 200 draws (top_k of Gumbel noise) into one graph, which took XLA:CPU
    # 148 s to compile here
    draws = torch.stack([torch.multinomial(probs, 4).cpu() for _ in range(200)])
    for row in draws:
        assert len(set(row.tolist())) == 4 and not ({0, 4} & set(row.tolist()))
    # the heaviest category comes first most of the time (8 / 12)
    _close((draws[:, 0] == 3).double().mean().item(), 8 / 12, 0.1)


# ---------------------------------------------------------------- reproducibility
def test_manual_seed_reproduces(eager):
    torch.manual_seed(123)
    a = [torch.rand(5, device=TPU).cpu(), torch.randn(5, device=TPU).cpu()]
    torch.manual_seed(123)
    b = [torch.rand(5, device=TPU).cpu(), torch.randn(5, device=TPU).cpu()]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], torch.rand(5, device=TPU).cpu())  # the generator advances


def test_generator_argument(eager):
    g = torch.Generator(device=TPU).manual_seed(1)
    a = torch.rand(6, device=TPU, generator=g).cpu()
    b = torch.rand(6, device=TPU, generator=g).cpu()
    assert not torch.equal(a, b)
    g2 = torch.Generator(device=TPU).manual_seed(1)
    assert torch.equal(torch.rand(6, device=TPU, generator=g2).cpu(), a)
    # a private generator does not disturb the default one
    torch.manual_seed(5)
    ref = torch.randn(4, device=TPU).cpu()
    torch.manual_seed(5)
    torch.randn(4, device=TPU, generator=torch.Generator(device=TPU).manual_seed(9))
    torch.empty(3, device=TPU).normal_(generator=torch.Generator(device=TPU).manual_seed(9))
    assert torch.equal(torch.randn(4, device=TPU).cpu(), ref)


def test_rng_state_roundtrip(eager):
    torch.manual_seed(0)
    state = torch.tpu.get_rng_state()
    a = torch.rand(4, device=TPU).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(4, device=TPU).cpu(), a)


def test_cpu_generator_rejected(eager):
    with pytest.raises(RuntimeError):
        torch.rand(3, device=TPU, generator=torch.Generator())


# ---------------------------------------------------------------- factories against CPU
FACTORIES = {
    "arange_end": lambda d: torch.arange(5, device=d),
    "arange_end_other_length": lambda d: torch.arange(8, device=d),
    "arange_start_step_float": lambda d: torch.arange(0.5, 2.0, 0.25, device=d),
    "arange_negative_step": lambda d: torch.arange(10, -3, -3, device=d),
    "arange_f64_fraction": lambda d: torch.arange(1, 2.5, 0.1, device=d, dtype=torch.float64),
    "arange_int_dtype_bf16": lambda d: torch.arange(0, 20, 3, device=d, dtype=torch.bfloat16),
    "arange_empty": lambda d: torch.arange(3, 3, device=d),
    "arange_int64_truncates_float_args": lambda d: torch.arange(0.5, 5, 1.5, device=d,
                                                                dtype=torch.int64),
    "arange_int16_negative_step": lambda d: torch.arange(10, -7, -3, device=d, dtype=torch.int16),
    "linspace": lambda d: torch.linspace(-1, 3, 7, device=d),
    "linspace_one": lambda d: torch.linspace(-1, 3, 1, device=d),
    "linspace_int64": lambda d: torch.linspace(-1, 10, 7, device=d, dtype=torch.int64),
    "linspace_bf16": lambda d: torch.linspace(-1, 10, 9, device=d, dtype=torch.bfloat16),
    "linspace_tensor_ends": lambda d: torch.linspace(torch.tensor(1.0, device=d),
                                                     torch.tensor(2.0, device=d), 5, device=d),
    "logspace": lambda d: torch.logspace(-1, 3, 7, device=d),
    "logspace_base2_int": lambda d: torch.logspace(0, 10, 11, base=2, device=d, dtype=torch.int64),
    "eye": lambda d: torch.eye(3, device=d),
    "eye_nm_int": lambda d: torch.eye(3, 5, device=d, dtype=torch.int64),
    "eye_bool": lambda d: torch.eye(2, 3, device=d, dtype=torch.bool),
    "empty_fill": lambda d: torch.empty(2, 3, device=d).fill_(2.5),
    "zeros_bf16": lambda d: torch.zeros(2, 3, device=d, dtype=torch.bfloat16),
    "ones_int32": lambda d: torch.ones(2, 3, device=d, dtype=torch.int32),
    "full": lambda d: torch.full((2, 3), 1.5, device=d),
    "full_int": lambda d: torch.full((2,), 7, device=d),
    "full_bool": lambda d: torch.full((2,), True, device=d),
    "scalar_tensor": lambda d: torch.scalar_tensor(3.5, device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2, 3, device=d)),
    "ones_like_dtype": lambda d: torch.ones_like(torch.ones(2, 3, device=d), dtype=torch.int64),
    "full_like": lambda d: torch.full_like(torch.ones(2, 3, device=d), 4),
    "empty_like_zero_": lambda d: torch.empty_like(torch.ones(3, device=d)).zero_(),
    "new_zeros": lambda d: torch.ones(2, device=d).new_zeros(3),
    "new_ones": lambda d: torch.ones(2, device=d).new_ones((2, 2), dtype=torch.int64),
    "new_full": lambda d: torch.ones(2, device=d).new_full((3,), 5.0),
    "new_tensor": lambda d: torch.ones(2, device=d).new_tensor([1, 2, 3]),
    "new_empty_fill": lambda d: torch.ones(2, device=d).new_empty(3).fill_(-1),
    "tensor_int": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "tensor_bf16": lambda d: torch.tensor([1.5, 2.25], device=d, dtype=torch.bfloat16),
    "fill_tensor_value": lambda d: torch.zeros(4, device=d).fill_(torch.tensor(3.0, device=d)),
    "zero_view": lambda d: _zero_columns(torch.ones(3, 4, device=d)),
}


def _zero_columns(x):
    x[:, 1:3].zero_()
    return x


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factory(eager, name):
    fn = FACTORIES[name]
    got = fn(TPU)
    assert got.device.type == TPU
    torch.testing.assert_close(got.cpu(), fn("cpu"))


def test_factory_follows_default_dtype(eager):
    torch.linspace(0, 1, 3, device=TPU)  # cache an entry under the float32 default
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for fn in (lambda d: torch.linspace(0, 1, 3, device=d), lambda d: torch.eye(2, device=d),
                   lambda d: torch.arange(0, 1, 0.5, device=d)):
            got = fn(TPU).cpu()
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, fn("cpu"))
    finally:
        torch.set_default_dtype(old)
