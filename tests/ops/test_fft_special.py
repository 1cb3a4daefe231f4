"""FFTs and torch.special's Bessel functions and orthogonal polynomials on tpu against CPU,
in Strict and in DeferAndFuse (the `eager` fixture)."""
import pytest
import torch

import torch_tpu  # noqa: F401

aten = torch.ops.aten


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_close(out, ref, **kw):
    tol = dict(atol=1e-4, rtol=1e-4, equal_nan=True) | kw
    torch.testing.assert_close(out.cpu(), ref, **tol)


# ---------------------------------------------------------------- FFT
# the three aten primitives, every normalization: 0 = none, 1 = 1/sqrt(n), 2 = 1/n
@pytest.mark.parametrize("norm", [0, 1, 2])
def test_fft_primitives(eager, norm):
    x = _randn(3, 4, 6)
    z = _randn(3, 4, 6, dtype=torch.complex64, seed=1)
    half = _randn(3, 4, 4, dtype=torch.complex64, seed=2)
    cases = [
        (lambda t: aten._fft_r2c(t, [2], norm, True), x),
        (lambda t: aten._fft_r2c(t, [0, 2], norm, False), x),
        (lambda t: aten._fft_r2c(t, [2, 1], norm, True), x),  # the halved dim is dim[-1]
        (lambda t: aten._fft_c2c(t, [1, 2], norm, True), z),
        (lambda t: aten._fft_c2c(t, [0], norm, False), z),
        (lambda t: aten._fft_c2r(t, [2], norm, 6), half),
        (lambda t: aten._fft_c2r(t, [2], norm, 7), half),  # odd length
        (lambda t: aten._fft_c2r(t, [0, 2], norm, 7), half),
    ]
    for fn, t in cases:
        out, ref = fn(t.to("tpu")), fn(t)
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert_close(out, ref)


@pytest.mark.parametrize("fn", [
    lambda t: torch.fft.fft(t, n=10, norm="ortho"),
    lambda t: torch.fft.rfft2(t),
    lambda t: torch.fft.irfft(torch.fft.rfft(t), n=t.shape[-1]),
    lambda t: torch.fft.fftn(t.to(torch.complex64), dim=(0, 1, 2, 3)),  # more dims than XLA's 3
    lambda t: torch.fft.ifftn(t.to(torch.complex64), s=(3, 8), norm="forward"),
])
def test_torch_fft_functions(eager, fn):
    x = _randn(2, 3, 4, 5)
    assert_close(fn(x.to("tpu")), fn(x))


def test_fft_backward(eager):
    x = _randn(4, 6)
    c, t = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    for leaf in (c, t):
        torch.fft.irfft(torch.fft.rfft(leaf) * 2, n=6).pow(2).sum().backward()
    assert_close(t.grad, c.grad)


def test_conjugate_views_of_fft_results(eager):
    """torch returns ifft/ihfft of real input as a lazy .conj() of _fft_r2c's result, and
    hfft conjugates its input the same way: the conj bit must survive clone, copy_, mm
    and the copy to the host."""
    x = _randn(4, 6)
    assert_close(torch.fft.ifft(x.to("tpu")), torch.fft.ifft(x))
    assert_close(torch.fft.ihfft(x.to("tpu")), torch.fft.ihfft(x))
    z = torch.fft.fft(x)
    t = z.to("tpu")
    assert_close(t.conj().clone(), z.conj().clone())
    assert_close(t.conj() @ t.T, z.conj() @ z.T)
    assert_close(torch._neg_view(t) + 0, -z)
    dst = t.clone()
    dst.conj().copy_(t)  # a write through a conj view stores the conjugate
    assert_close(dst, z.conj())
    assert_close(z.conj().to("tpu"), z.conj())


# ---------------------------------------------------------------- special functions
BESSEL = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
          "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
          "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
          "airy_ai"]
# every branch of torch's kernels, their boundaries, and the domain edges
_X = torch.cat([torch.linspace(-12, 12, 49),
                torch.tensor([0.0, -0.0, 1e-6, 0.5, -2.09, 2.09, 2.0, 5.0, 8.0, 8.5, 50.0,
                              110.0, -60.0, float("inf"), -float("inf"), float("nan")])])


@pytest.mark.parametrize("name", BESSEL)
def test_bessel_and_airy(eager, name):
    fn = getattr(torch.special, name)
    assert_close(fn(_X.to("tpu")), fn(_X), atol=1e-6, rtol=1e-5)
    ints = torch.arange(-3, 4)
    assert_close(fn(ints.to("tpu")), fn(ints), atol=1e-6, rtol=1e-5)  # int -> float


POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
               "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
               "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_orthogonal_polynomials(eager, name):
    fn = getattr(torch.special, name)
    # both ends of [-1, 1] and [0, 1], inside (the trigonometric forms) and outside (the
    # recurrence), non-integer, negative, NaN and above-limit degrees (Hermite: NaN > 128)
    x = torch.cat([torch.linspace(-1.5, 1.5, 13), torch.tensor([-1.0, 0.0, 1.0, 0.99999994])])
    n = torch.tensor([-1.0, 0.0, 1.0, 2.0, 5.0, 7.0, 9.0, 20.0, 2.7, float("nan"), 130.0])
    X, N = torch.meshgrid(x, n, indexing="ij")
    assert_close(fn(X.to("tpu"), N.to("tpu")), fn(X, N))
    assert_close(fn(x.to("tpu"), 3), fn(x, 3))  # a Scalar degree
    assert_close(fn(0.25, n.to("tpu")), fn(0.25, n))  # a Scalar x
    k = torch.arange(5)
    assert_close(fn(k.to("tpu"), k.to("tpu")), fn(k, k))  # int inputs compute in float


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_incomplete_gamma_boundaries(eager, fn):
    """torch's boundary values, in its order: a or x negative, a = 0, x = 0, a or x inf."""
    v = torch.tensor([0.0, -0.0, 0.25, 1.0, 3.0, 50.0, -1.0, float("inf"), -float("inf"),
                      float("nan")], dtype=torch.float64)
    a, x = torch.meshgrid(v, v, indexing="ij")
    assert_close(fn(a.to("tpu"), x.to("tpu")), fn(a, x))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_polygamma_near_negative_half_integers(eager, n):
    """The zeta's leading terms cancel for x < 0: CPU sums them in float64 (its
    acc_type<float>), and float32 sums were 2e-4 off."""
    x = torch.tensor([-2.4999818, -3.5000274, -3.4999759, -8.5000134, 0.3, 5.0])
    assert_close(torch.polygamma(n, x.to("tpu")), torch.polygamma(n, x), atol=1e-6, rtol=1e-6)
