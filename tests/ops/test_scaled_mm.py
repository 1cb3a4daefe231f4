"""fp8 scaled matmul on tpu: `torch._scaled_mm` and `torch.nn.functional.scaled_mm`
(`_scaled_mm_v2`) for each scale recipe and output dtype, in Strict, DeferAndFuse and
compiled, against CPU's kernel where CPU has the recipe (tensor-wise, row-wise) and a
float32 dequantised reference where it does not (MX 1x32 blocks, 1x128, 128x128)."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.functional import ScalingType as S
from torch.nn.functional import SwizzleType as W

import torch_tpu  # noqa: F401

M, K, N = 128, 256, 128
E4, E5, E8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _operands(dtype=E4, seed=0, m=M, n=N):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, K, generator=g) * 3).to(dtype)
    b = (torch.randn(n, K, generator=g) * 3).to(dtype).t()   # column-major, as CUDA wants
    return a, b


def _tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _on_tpu(fn, args, compiled=False):
    if compiled:
        torch._dynamo.reset()  # (one lambda's code, many cases: past the recompile limit
        #                        dynamo would run it eagerly)
    f = torch.compile(fn, backend="tpu", dynamic=False) if compiled else fn
    out = f(*[_tpu(x) for x in args])
    assert out.device.type == "tpu"
    return out.cpu()


def _close(got, want, dtype):
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}.get(dtype, 0.07)
    scale = want.float().abs().max().item()
    assert (got.float() - want.float()).abs().max().item() <= tol * scale


def _tiles(s):
    """A [rows, cols] block-scale matrix in cuBLAS's swizzled layout (128 x 4 tiles, each
    stored as 32 x 4 x 4), written from its description, as torchao's to_blocked does."""
    rows, cols = s.shape
    rt, ct = -(-rows // 128), -(-cols // 4)
    padded = torch.ones(rt * 128, ct * 4)
    padded[:rows, :cols] = s.float()
    t = padded.view(rt, 128, ct, 4).permute(0, 2, 1, 3).reshape(-1, 4, 32, 4)
    return t.transpose(1, 2).reshape(-1).to(s.dtype)


def _dequant(x, scale, block):
    """x [rows, K] times its block scale [rows / block[0], K / block[1]], in float32."""
    s = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return x.float() * s[:x.shape[0], :x.shape[1]]


CPU_RECIPES = {
    "tensorwise": lambda: dict(scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0)),
    "rowwise": lambda: dict(scale_a=torch.rand(M, 1) + 0.5, scale_b=torch.rand(1, N) + 0.5),
}


@pytest.mark.parametrize("recipe", sorted(CPU_RECIPES))
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_scaled_mm_matches_cpu(eager, recipe, out_dtype, bias):
    a, b = _operands()
    kw = CPU_RECIPES[recipe]()
    if bias:
        kw["bias"] = torch.randn(N).to(out_dtype)
    want = torch._scaled_mm(a, b, out_dtype=out_dtype, **kw)
    got = _on_tpu(lambda x, y, *s: torch._scaled_mm(x, y, **dict(zip(kw, s)), out_dtype=out_dtype),
                  (a, b, *kw.values()))
    _close(got, want, out_dtype)


@pytest.mark.parametrize("dtype", [E4, E5], ids=str)
def test_scaled_mm_float8_result_and_scale_result(eager, dtype):
    a, b = _operands(dtype)
    one = torch.tensor(1.0)
    for kw in (dict(), dict(scale_result=torch.tensor(4.0), out_dtype=dtype)):
        want = torch._scaled_mm(a, b, scale_a=one, scale_b=one, **kw)
        got = _on_tpu(lambda x, y, sa, sb, *r: torch._scaled_mm(
            x, y, scale_a=sa, scale_b=sb, **dict(zip(kw, r)) | {k: v for k, v in kw.items()
                                                                if k == "out_dtype"}),
            (a, b, one, one, *[v for v in kw.values() if isinstance(v, torch.Tensor)]))
        assert got.dtype == dtype
        # float8 results (NaN past the range, as on CPU): a float32 sum in another order
        # may round to the neighbouring float8 value (one step: 2**-3 of it, or 2**-2),
        # or past the range where CPU's is just inside it
        g, w = got.float(), want.float()
        finite = g.isfinite() & w.isfinite()
        torch.testing.assert_close(g[finite], w[finite], rtol=0.26, atol=0)
        assert (g.isnan() != w.isnan()).float().mean() < 0.005
        assert (g[finite] == w[finite]).float().mean() > 0.98


# name: (recipe of a, of b, block, scale dtype); the pairs CUDA has
BLOCKS = {"mx1x32": (S.BlockWise1x32, S.BlockWise1x32, (1, 32), E8),
          "1x128": (S.BlockWise1x128, S.BlockWise1x128, (1, 128), None),
          "1x128-128x128": (S.BlockWise1x128, S.BlockWise128x128, None, None),
          "128x128-1x128": (S.BlockWise128x128, S.BlockWise1x128, None, None)}
_SHAPE = {S.BlockWise1x32: (1, 32), S.BlockWise1x128: (1, 128), S.BlockWise128x128: (128, 128)}


def _scale(recipe, rows, dtype, g):
    """(the scale as the op takes it, its [rows / block, K / block] matrix)."""
    br, bk = _SHAPE[recipe]
    s = torch.rand(-(-rows // br), -(-K // bk), generator=g) * 4 + 0.25
    s = s.to(dtype) if dtype is not None else s
    if recipe == S.BlockWise128x128:  # CUDA's layout: K blocks first, padded to 4
        arg = torch.ones(-(-s.shape[1] // 4) * 4, s.shape[0])
        arg[:s.shape[1]] = s.t()
        return arg.t().contiguous().t(), s  # and outer-dim-major, as CUDA checks
    if recipe == S.BlockWise1x128:
        return s.t().contiguous().t(), s
    return s, s


@pytest.mark.parametrize("name", list(BLOCKS))
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_block_scales_match_dequantised_reference(eager, name, out_dtype):
    ra, rb, _, sdtype = BLOCKS[name]
    g = torch.Generator().manual_seed(1)
    a, b = _operands()
    (sa, ma), (sb, mb) = _scale(ra, M, sdtype, g), _scale(rb, N, sdtype, g)
    want = (_dequant(a, ma, _SHAPE[ra]) @ _dequant(b.t(), mb, _SHAPE[rb]).t()).to(out_dtype)
    if name == "mx1x32":  # CUDA's rule, which the meta kernel applies: MX scales swizzled
        sa, sb, swz = _tiles(sa), _tiles(sb), W.SWIZZLE_32_4_4
    else:
        swz = W.NO_SWIZZLE
    got = _on_tpu(lambda x, y, s1, s2: F.scaled_mm(
        x, y, s1, ra, s2, rb, swizzle_a=swz, swizzle_b=swz, output_dtype=out_dtype),
        (a, b, sa, sb))
    _close(got, want, out_dtype)
    if name == "mx1x32":  # _scaled_mm reads e8m0 scales as swizzled MX ones, as on CUDA
        got = _on_tpu(lambda x, y, s1, s2: torch._scaled_mm(x, y, s1, s2, out_dtype=out_dtype),
                      (a, b, sa, sb))
        _close(got, want, out_dtype)


def test_mx_scales_of_partial_tiles(eager):
    """64 rows of a and 48 of b: the swizzled scales are padded to whole 128 x 4 tiles."""
    g = torch.Generator().manual_seed(2)
    a, b = _operands(m=64, n=48)
    sa, _ = _scale(S.BlockWise1x32, 64, E8, g)
    sb, _ = _scale(S.BlockWise1x32, 48, E8, g)
    want = _dequant(a, sa, (1, 32)) @ _dequant(b.t(), sb, (1, 32)).t()
    got = _on_tpu(lambda x, y, s1, s2: torch._scaled_mm(x, y, s1, s2, out_dtype=torch.float32),
                  (a, b, _tiles(sa), _tiles(sb)))
    _close(got, want, torch.float32)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", *BLOCKS])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_compiled_scaled_mm(recipe, out_dtype):
    a, b = _operands()
    if recipe in CPU_RECIPES:
        kw = CPU_RECIPES[recipe]()
        bias = torch.randn(N).to(out_dtype)
        want = torch._scaled_mm(a, b, bias=bias, out_dtype=out_dtype, **kw)
        got = _on_tpu(lambda x, y, sa, sb, c: torch._scaled_mm(
            x, y, scale_a=sa, scale_b=sb, bias=c, out_dtype=out_dtype),
            (a, b, *kw.values(), bias), compiled=True)
        _close(got, want, out_dtype)
        return
    ra, rb, _, sdtype = BLOCKS[recipe]
    g = torch.Generator().manual_seed(1)
    (sa, ma), (sb, mb) = _scale(ra, M, sdtype, g), _scale(rb, N, sdtype, g)
    want = (_dequant(a, ma, _SHAPE[ra]) @ _dequant(b.t(), mb, _SHAPE[rb]).t()).to(out_dtype)
    # compiled, unswizzled MX scales are accepted too (the fake tensors' device is tpu)
    got = _on_tpu(lambda x, y, s1, s2: F.scaled_mm(x, y, s1, ra, s2, rb, output_dtype=out_dtype),
                  (a, b, sa, sb), compiled=True)
    _close(got, want, out_dtype)


def test_float8_linear_layer_trains_like_cpu(eager):
    """A user's fp8 linear: weights and activations cast to float8 with tensor-wise scales
    per step, forward through _scaled_mm, backward through the float32 master weights."""
    def step(device):
        torch.manual_seed(0)  # (tpu draws its own random numbers: the data comes from CPU)
        w = torch.randn(N, K).to(device).requires_grad_()
        x = torch.randn(M, K).to(device)
        opt = torch.optim.SGD([w], lr=0.1)
        losses = []
        for _ in range(3):
            sx = x.abs().amax() / 448
            sw = w.detach().abs().amax() / 448
            x8, w8 = (x / sx).to(E4), (w.detach() / sw).to(E4)
            y = torch._scaled_mm(x8, w8.t(), scale_a=sx.float(), scale_b=sw.float(),
                                 out_dtype=torch.float32)
            # straight-through: the fp8 product's value, the float32 product's gradient
            y = (x @ w.t()) + (y - (x @ w.t())).detach()
            loss = y.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, w.detach().cpu()

    (l_cpu, w_cpu), (l_tpu, w_tpu) = step("cpu"), step("tpu")
    assert l_tpu == pytest.approx(l_cpu, rel=1e-5)
    torch.testing.assert_close(w_tpu, w_cpu, rtol=1e-5, atol=1e-6)


def test_bad_scales_raise_naming_the_op():
    a, b = _operands()
    one = torch.tensor(1.0, device="tpu")
    with pytest.raises(RuntimeError, match="scale"):
        F.scaled_mm(a.to("tpu"), b.to("tpu"), torch.rand(M, 3, device="tpu").to(E8),
                    S.BlockWise1x32, torch.rand(N, 3, device="tpu").to(E8), S.BlockWise1x32,
                    swizzle_a=W.SWIZZLE_32_4_4, swizzle_b=W.SWIZZLE_32_4_4)
    with pytest.raises((RuntimeError, ValueError)):
        torch._scaled_mm(a.float().to("tpu"), b.to("tpu"), scale_a=one, scale_b=one)
    # the process goes on
    got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), scale_a=one, scale_b=one,
                           out_dtype=torch.float32).cpu()
    torch.testing.assert_close(got, torch._scaled_mm(a, b, scale_a=torch.tensor(1.0),
                                                     scale_b=torch.tensor(1.0),
                                                     out_dtype=torch.float32))


def test_float8_dtypes_round_trip(eager):
    x = torch.randn(64, 48) * 8
    for dtype in (E4, E5, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        want = x.to(dtype)
        got = x.to("tpu").to(dtype)
        assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(got.t().contiguous().float().cpu(), want.t().contiguous().float())
        assert torch.equal(got[::2, 1:].view(torch.uint8).cpu(), want[::2, 1:].view(torch.uint8))
    s = torch.rand(40) * 100 + 1e-3
    assert torch.equal(s.to("tpu").to(E8).float().cpu(), s.to(E8).float())
