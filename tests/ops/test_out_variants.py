"""out= as PyTorch defines it, on tpu, in Strict, Debug and DeferAndFuse: the out tensor's
device is checked, a non-empty out of another shape is resized with torch's warning, a
right-sized non-contiguous out keeps its strides, and a factory's out= computes in the
out's dtype. Each case is user code run on CPU and on tpu, compared.
"""
import warnings

import pytest
import torch

import torch_tpu

MODES = ["strict", "debug", "defer_and_fuse"]
RESIZED = "An output with one or more elements was resized"


def _run(fn, dev):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(dev)
    return out, [str(w.message) for w in caught]


# tpu inputs, a CPU out tensor: refused, naming both devices, with the out left as it was
ON_CPU = {
    "add": lambda a, b, o: torch.add(a, b, out=o),
    "exp": lambda a, b, o: torch.exp(a, out=o),
    "mm": lambda a, b, o: torch.mm(a, b, out=o),
    "cat": lambda a, b, o: torch.cat([a, b], out=o),
    "where": lambda a, b, o: torch.where(a > 0, a, b, out=o),
    "sort values": lambda a, b, o: torch.sort(a, out=(o, torch.empty(4, 4, dtype=torch.long,
                                                                     device="tpu"))),
    "std": lambda a, b, o: torch.std(a, dim=0, out=o),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ON_CPU))
def test_out_on_another_device_is_refused(mode, case):
    with torch_tpu.eager_mode(mode):
        a = torch.randn(4, 4, device="tpu")
        b = torch.randn(4, 4, device="tpu")
        out = torch.full((4, 4), 7.0)
        with pytest.raises(RuntimeError, match="Expected out tensor to have device tpu:0, but "
                                                "got cpu instead"):
            ON_CPU[case](a, b, out)
        assert (out == 7.0).all()
        torch.tpu.synchronize()  # nothing was left pending by the refusal


@pytest.mark.parametrize("case", ["add", "cat", "slice_scatter"])
def test_compiled_out_on_another_device_is_refused(case):
    """torch.compile: AOTAutograd makes out= a copy into the out, which may cross devices;
    the backend refuses it as eager does (slice_scatter's fake kernel checks nothing)."""
    fn = {**ON_CPU, "slice_scatter": lambda a, b, o: torch.slice_scatter(a, b[:2], 0, 0, 2,
                                                                          out=o)}[case]
    a = torch.randn(4, 4, device="tpu")
    b = torch.randn(4, 4, device="tpu")
    out = torch.full((4, 4), 7.0)
    # (dynamo's own fake kernels refuse add's and cat's first, as they would for cuda)
    with pytest.raises(RuntimeError, match="Expected out tensor to have device tpu:0, but got "
                                            "cpu instead|two devices, tpu:0 and cpu"):
        torch.compile(fn, backend="tpu", dynamic=False)(a, b, out)
    assert (out == 7.0).all()
    got = torch.empty(4, 4, device="tpu")  # the same call with a tpu out runs
    torch.compile(fn, backend="tpu", dynamic=False)(a, b, got)
    torch.testing.assert_close(got.cpu(), fn(a.cpu(), b.cpu(), torch.empty(4, 4)))


# a non-empty out of another shape: resized, with torch's warning; an empty one: silently
RESIZE = {
    "add": lambda d, o: torch.add(torch.ones(4, 4, device=d), 2, out=o),
    "cumsum": lambda d, o: torch.cumsum(torch.arange(16.0, device=d).view(4, 4), 0, out=o),
    "matmul": lambda d, o: torch.matmul(torch.ones(4, 3, device=d), torch.ones(3, 4, device=d),
                                        out=o),
    "sum": lambda d, o: torch.sum(torch.ones(4, 4, device=d), 1, out=o),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(RESIZE))
@pytest.mark.parametrize("numel", [3, 0])
def test_out_resize_warns_as_cpu(mode, case, numel):
    def user(dev):
        out = torch.zeros(numel, device=dev)
        RESIZE[case](dev, out)
        return out.cpu()

    want, cpu_warned = _run(user, "cpu")
    with torch_tpu.eager_mode(mode):
        got, tpu_warned = _run(user, "tpu")
    torch.testing.assert_close(got, want)
    assert any(RESIZED in w for w in cpu_warned) == (numel > 0)
    # CPU's C++ warning ends with where in torch it was raised
    def resized(ws):
        return [w.split(" (Triggered internally")[0] for w in ws if RESIZED in w]
    assert resized(tpu_warned) == resized(cpu_warned)


# a right-sized non-contiguous out keeps its strides, and the elements between its own
# (not _softmax.out: torch 2.13's CPU kernel writes such an out as if it were contiguous)
STRIDED = {
    "add": lambda d, o: torch.add(torch.ones(4, 4, device=d), 2, out=o),
    "full": lambda d, o: torch.full((4, 4), 2.5, out=o, device=d),
    "softmax with dtype": lambda d, o: torch.ops.aten.softmax.int_out(
        torch.arange(16.0, device=d).view(4, 4), 1, torch.float32, out=o),
    "log_softmax with dtype": lambda d, o: torch.ops.aten.log_softmax.int_out(
        torch.arange(16.0, device=d).view(4, 4), 1, torch.float32, out=o),
    "resize_ to its own shape": lambda d, o: o.resize_(4, 4).fill_(3.0),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(STRIDED))
def test_non_contiguous_out_keeps_its_strides(mode, case):
    def user(dev):
        base = torch.full((4, 8), -1.0, device=dev)
        out = base[:, ::2]
        STRIDED[case](dev, out)
        return out.stride(), base.cpu()

    (want_stride, want), _ = _run(user, "cpu")
    with torch_tpu.eager_mode(mode):
        (got_stride, got), _ = _run(user, "tpu")
    assert got_stride == want_stride == (8, 2)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", MODES)
def test_factory_out_computes_in_the_out_dtype(mode):
    """arange's out= takes the out's dtype: an int64 out truncates a fractional step to 0,
    which CPU refuses (before, tpu computed in float and cast: a silent wrong answer)."""
    with torch_tpu.eager_mode(mode):
        for dtype in (torch.float32, torch.float64, torch.int64):
            for args in [(0, 64, 0.5), (0, 10, 3), (2.5, 9.0, 1.5)]:
                want = got = None
                try:
                    want = torch.arange(*args, out=torch.empty(0, dtype=dtype))
                except Exception as e:  # noqa: BLE001 - compared below
                    want = e
                try:
                    got = torch.arange(*args, out=torch.empty(0, dtype=dtype, device="tpu")).cpu()
                except Exception as e:  # noqa: BLE001
                    got = e
                if isinstance(want, Exception):
                    assert type(got) is type(want) and str(got) == str(want), (dtype, args, got)
                else:
                    torch.testing.assert_close(got, want)
            torch.testing.assert_close(
                torch.linspace(0, 1, 5, out=torch.empty(5, dtype=dtype, device="tpu")).cpu(),
                torch.linspace(0, 1, 5, out=torch.empty(5, dtype=dtype)))


@pytest.mark.parametrize("mode", MODES)
def test_float64_denormals_survive_data_movement(mode):
    """A float64 denormal keeps its value through upload, download, copies, views and cat.
    (Arithmetic on XLA:CPU flushes denormals, as TPUs do: docs/CONFORMANCE.md.)"""
    x = torch.tensor([1e-310, -4e-320, 1.0], dtype=torch.float64)
    with torch_tpu.eager_mode(mode):
        t = x.to("tpu")
        for moved in (t, t.clone(), t[:2].contiguous(), torch.cat([t, t])[:3],
                      t.view(3, 1).t().reshape(3), torch.empty_like(t).copy_(t)):
            assert moved.cpu().tolist()[:2] == x.tolist()[:2]


# an out of another dtype: refused where CPU's kernel wants the exact dtype (no meta
# kernel says so), accepted and cast where CPU accepts; conj_physical's out= runs at all
OUT_DTYPE = {
    "bitwise_not into float": lambda d: torch.bitwise_not(
        torch.ones(3, dtype=torch.long, device=d), out=torch.empty(3, device=d)),
    "isin into float": lambda d: torch.isin(torch.ones(3, device=d), torch.ones(2, device=d),
                                            out=torch.empty(3, device=d)),
    "geqrf into long": lambda d: torch.geqrf(torch.eye(3, device=d), out=(
        torch.empty(3, 3, dtype=torch.long, device=d), torch.empty(3, dtype=torch.long, device=d))),
    "sum into double": lambda d: torch.sum(torch.ones(3, device=d), 0,
                                           out=torch.empty((), dtype=torch.float64, device=d)),
    "conj_physical": lambda d: torch.conj_physical(
        torch.tensor([1 + 2j, 3 - 1j], device=d), out=torch.empty(2, dtype=torch.complex64, device=d)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(OUT_DTYPE))
def test_out_dtype_as_cpu(mode, case):
    def user(dev):
        try:
            r = OUT_DTYPE[case](dev)
        except RuntimeError as e:
            return e
        return [t.cpu() for t in (r if isinstance(r, tuple) else (r,))]

    want, _ = _run(user, "cpu")
    with torch_tpu.eager_mode(mode):
        got, _ = _run(user, "tpu")
    if isinstance(want, Exception):
        assert isinstance(got, RuntimeError) and str(got) == str(want), got
    else:
        torch.testing.assert_close(got, want)



def _batch_norm_out(d):
    """_native_batch_norm_legit.out: the functional op writes the running stats too."""
    x = torch.arange(30.0, device=d).view(2, 3, 5).sin()
    stats = (torch.zeros(3, device=d), torch.ones(3, device=d))
    outs = [torch.empty(0, device=d) for _ in range(3)]
    torch.ops.aten._native_batch_norm_legit.out(x, None, None, *stats, True, 0.1, 1e-5,
                                                out=outs[0], save_mean=outs[1], save_invstd=outs[2])
    return (*outs, *stats)


def _narrow_copy_out(d):
    out = torch.empty(0, device=d)
    torch.narrow_copy(torch.arange(12.0, device=d).view(3, 4), 1, -3, 2, out=out)
    return (out,)


def _eigvals_out(d):
    out = torch.empty(5, dtype=torch.complex64, device=d)
    torch.linalg.eigvals(torch.tensor([[2.0, 1.0], [-1.0, 3.0]], device=d), out=out)
    return (out,)


# out= variants whose functional op is composite or writes arguments of its own
DERIVED = {"narrow_copy": _narrow_copy_out, "linalg.eigvals": _eigvals_out,
           "_native_batch_norm_legit": _batch_norm_out}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(DERIVED))
def test_out_of_composite_and_mutating_functionals(mode, case):
    def user(dev):
        return [t.cpu() for t in DERIVED[case](dev)]

    want, cpu_warned = _run(user, "cpu")
    with torch_tpu.eager_mode(mode):
        got, tpu_warned = _run(user, "tpu")
    torch.testing.assert_close(got, want)
    assert [RESIZED in w for w in tpu_warned] == [RESIZED in w for w in cpu_warned]


@pytest.mark.parametrize("mode", MODES)
def test_out_dtype_a_meta_kernel_refuses_and_cpu_accepts(mode):
    """bernoulli.out into an int64 out: torch's Python meta kernel refuses the cast, CPU's
    kernel draws 0s and 1s into it; CPU decides. (Random: the values are not CPU's.)"""
    def user(dev):
        out = torch.empty(64, dtype=torch.int64, device=dev)
        r = torch.bernoulli(torch.full((64,), 0.5, device=dev), out=out)
        return r is out, out.dtype, set(out.cpu().tolist()) <= {0, 1}

    want, _ = _run(user, "cpu")
    with torch_tpu.eager_mode(mode):
        got, _ = _run(user, "tpu")
    assert got == want == (True, torch.int64, True)
