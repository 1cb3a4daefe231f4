"""Scaled low-precision matrix products: `torch._scaled_mm` and `_scaled_mm_v2` (the op
under `torch.nn.functional.scaled_mm`, torchao's float8 training and fp8 inference).

    out = (dequant(a) @ dequant(b) + bias) / scale_result,  cast to out_dtype

a is [M, K], b is [K, N], both float8 (e4m3fn, e5m2 and the fnuz forms); dequant multiplies
each element by its scale. The scale recipes, as CUDA names them (ScalingType):
  TensorWise        one float32 scale per operand
  RowWise           float32 scale_a [M, 1] and scale_b [1, N]
  BlockWise1x32     MX: one float8_e8m0fnu (or float32) scale per 32 consecutive elements
                    along K: scale_a [M, K/32], scale_b [N, K/32]
  BlockWise1x128    the same with blocks of 128 (float32 scales, DeepSeek-style)
  BlockWise128x128  one scale per 128 x 128 tile, in CUDA's layout: [L4, rows/128] with the
                    K blocks first, padded to L4 = a multiple of 4 (rows: M for a, N for b)
Blocks are rounded up (a last partial block has its own scale). A block-scale tensor may
come in cuBLAS's swizzled layout (SwizzleType.SWIZZLE_32_4_4: 128 x 4 tiles of the scale
matrix, each stored as 32 x 4 x 4, the matrix padded to whole tiles), which `_scaled_mm`
assumes for e8m0 scales whose size is the padded one, as CUDA does; `_scaled_mm_v2` says
which layout it passes. The products accumulate in float32 (tensor-wise and row-wise
scales multiply the float32 product, block scales the operands), `use_fast_accum` changes
nothing here, and `scale_result` divides only a float8 result (CPU's rule). float4
(`float4_e2m1fn_x2`, NVFP4's BlockWise1x16) is refused: XLA has no packed fp4 type here.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from .._runtime import jax_dtype
from .registry import aten, lowering

_F32 = jnp.float32
_FP8 = tuple(jnp.dtype(t) for t in (jnp.float8_e4m3fn, jnp.float8_e5m2,
                                    jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz))
TENSOR, ROW, B1X16, B1X32, B1X128, B128X128 = range(6)   # torch.nn.functional.ScalingType
_BLOCKS = {B1X32: (1, 32), B1X128: (1, 128), B128X128: (128, 128)}
NO_SWIZZLE, SWIZZLE_32_4_4 = range(2)                     # torch.nn.functional.SwizzleType
_NAMES = {TENSOR: "TensorWise", ROW: "RowWise", B1X16: "BlockWise1x16", B1X32: "BlockWise1x32",
          B1X128: "BlockWise1x128", B128X128: "BlockWise128x128"}


def _fail(op: str, message: str):
    raise RuntimeError(f"{op}: {message}")


def _check_operands(op, a, b):
    if a.ndim != 2 or b.ndim != 2:
        _fail(op, f"inputs must be 2D, got {a.ndim}D and {b.ndim}D")
    for name, x in (("self", a), ("mat2", b)):
        if x.dtype not in _FP8:
            _fail(op, f"{name} must be a float8 tensor (float8_e4m3fn, float8_e5m2 or their "
                      f"fnuz forms) on tpu, got {x.dtype}")
    if a.shape[1] != b.shape[0]:
        _fail(op, f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                  f"{b.shape[0]}x{b.shape[1]})")


def _padded_tiles(rows: int, cols: int) -> int:
    return math.ceil(rows / 128) * 128 * math.ceil(cols / 4) * 4


def _unswizzle(scale, rows: int, cols: int):
    """cuBLAS's block-scale layout back to the [rows, cols] scale matrix: the matrix, padded
    to 128 x 4 tiles, is stored tile by tile (row tiles outer), and within a tile the
    element (32 i + j, c) sits at j * 16 + i * 4 + c."""
    row_tiles, col_tiles = math.ceil(rows / 128), math.ceil(cols / 4)
    t = scale.reshape(row_tiles, col_tiles, 32, 4, 4)          # [.., j, i, c]
    t = t.transpose(0, 1, 3, 2, 4).reshape(row_tiles, col_tiles, 128, 4)
    return t.transpose(0, 2, 1, 3).reshape(row_tiles * 128, col_tiles * 4)[:rows, :cols]


def _block_scale(op, name, scale, recipe, swizzle, rows, k):
    """The [rows, K] multiplier of an operand given as [rows, K] (b transposed)."""
    br, bk = _BLOCKS[recipe]
    srows, scols = math.ceil(rows / br), math.ceil(k / bk)
    if recipe == B128X128:
        padded = math.ceil(scols / 4) * 4
        if tuple(scale.shape) != (padded, srows):
            _fail(op, f"{name} for BlockWise128x128 scaling must have shape [{padded}, {srows}] "
                      f"(K blocks first, padded to a multiple of 4), got {tuple(scale.shape)}")
        s = scale[:scols].T
    elif swizzle == SWIZZLE_32_4_4:
        if scale.size != _padded_tiles(srows, scols):
            _fail(op, f"{name} in the swizzled layout must have {_padded_tiles(srows, scols)} "
                      f"elements for a {srows}x{scols} {_NAMES[recipe]} scale, got {scale.size}")
        s = _unswizzle(scale.reshape(-1), srows, scols)
    else:
        if scale.size != srows * scols:
            _fail(op, f"{name} for {_NAMES[recipe]} scaling must have {srows}x{scols} elements, "
                      f"got shape {tuple(scale.shape)}")
        s = scale.reshape(srows, scols)
    s = jnp.repeat(jnp.repeat(s.astype(_F32), br, axis=0), bk, axis=1)
    return s[:rows, :k]


def _scaled_product(op, a, b, recipes, scales, swizzles, bias, scale_result, out_dtype):
    _check_operands(op, a, b)
    m, k = a.shape
    n = b.shape[1]
    ra, rb = recipes
    sa, sb = scales
    if B1X16 in recipes:
        _fail(op, "BlockWise1x16 (NVFP4) scaling needs float4_e2m1fn_x2 operands, which tpu "
                  "does not support")
    if ra in (TENSOR, ROW) and ra == rb:
        want = ((1, 1), (1, 1)) if ra == TENSOR else ((m, 1), (1, n))
        for name, s, (r, c) in (("scale_a", sa, want[0]), ("scale_b", sb, want[1])):
            if s.dtype != _F32 or s.size != r * c:
                _fail(op, f"{_NAMES[ra]} scaling needs a float32 {name} with {r * c} "
                          f"element(s) ({r}x{c}), got {s.dtype} of shape {tuple(s.shape)}")
        prod = jnp.matmul(a.astype(_F32), b.astype(_F32), preferred_element_type=_F32)
        out = prod * sa.reshape(-1, 1).astype(_F32) * sb.reshape(1, -1).astype(_F32)
    elif ra in _BLOCKS and rb in _BLOCKS:
        da = a.astype(_F32) * _block_scale(op, "scale_a", sa, ra, swizzles[0], m, k)
        db = b.astype(_F32) * _block_scale(op, "scale_b", sb, rb, swizzles[1], n, k).T
        out = jnp.matmul(da, db, preferred_element_type=_F32)
    else:
        _fail(op, f"unsupported scaling configuration: scale_a {_NAMES.get(ra, ra)} with "
                  f"scale_b {_NAMES.get(rb, rb)} (tpu supports TensorWise, RowWise, "
                  "BlockWise1x32, BlockWise1x128 and BlockWise128x128, the same on both sides)")
    if bias is not None:
        out = out + bias.astype(_F32)
    if scale_result is not None and jnp.dtype(out_dtype) in _FP8:
        out = out / scale_result.reshape(()).astype(_F32)
    return out   # the executor rounds it once to the result's dtype


def _v1_recipe(a_rows, n, k, scale, other):
    """_scaled_mm's recipe from the scales' dtypes and sizes, as CUDA reads them."""
    if scale.size == 1 and other.size == 1:
        return TENSOR, NO_SWIZZLE
    if scale.dtype == jnp.dtype(jnp.float8_e8m0fnu):
        swizzled = scale.size == _padded_tiles(a_rows, math.ceil(k / 32))
        return B1X32, SWIZZLE_32_4_4 if swizzled else NO_SWIZZLE
    return ROW, NO_SWIZZLE


@lowering(aten._scaled_mm.default)
def _scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
               use_fast_accum=False):
    op = "_scaled_mm"
    _check_operands(op, self, mat2)
    (m, k), n = self.shape, mat2.shape[1]
    ra, wa = _v1_recipe(m, n, k, scale_a, scale_b)
    rb, wb = _v1_recipe(n, m, k, scale_b, scale_a)
    dtype = self.dtype if out_dtype is None else jax_dtype(out_dtype)
    return _scaled_product(op, self, mat2, (ra, rb), (scale_a, scale_b), (wa, wb), bias,
                           scale_result, dtype)


@lowering(aten._scaled_mm_v2.default)
def _scaled_mm_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b,
                  bias, out_dtype, contraction_dim=(), use_fast_accum=False):
    op = "_scaled_mm_v2"
    if len(scale_a) != 1 or len(scale_b) != 1:
        _fail(op, "tpu supports one scale tensor per operand (two-level scaling is not "
                  f"supported), got {len(scale_a)} and {len(scale_b)}")
    if list(contraction_dim) not in ([], [1, 0]):
        _fail(op, f"contraction_dim must be [1, 0] (K is self's dim 1 and mat2's dim 0), got "
                  f"{list(contraction_dim)}")
    wa = swizzle_a[0] if swizzle_a else NO_SWIZZLE
    wb = swizzle_b[0] if swizzle_b else NO_SWIZZLE
    dtype = self.dtype if out_dtype is None else jax_dtype(out_dtype)
    return _scaled_product(op, self, mat2, (recipe_a[0], recipe_b[0]),
                           (scale_a[0], scale_b[0]), (wa, wb), bias, None, dtype)
