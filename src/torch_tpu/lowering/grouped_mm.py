"""Grouped matrix products: `torch._grouped_mm` (F.grouped_mm), the experts of
mixture-of-experts layers (transformers' MoE integration calls it on tpu for every dtype).

`offs` holds each group's end along the ragged dimension (cumulative, int32). The four
forms, as torch defines them:
  a 2D (M, K), b 3D (G, K, N)   rows of a in groups, each times its b[g]    -> (M, N)
  a 3D (G, M, K), b 2D (K, N)   columns of b in groups, a[g] times each     -> (M, N)
  a 2D (M, K), b 2D (K, N)      K in groups: a[:, g] @ b[g, :] per group    -> (G, M, N)
  a 3D, b 3D                    no offs: a batched product                  -> (G, M, N)
Before this lowering, ATen's composite kernel ran one mm per group after reading `offs` to
the host: a sync per call, and a new program for each group size, every step.

Each form is one `lax.ragged_dot_general` (a TPU runs it natively; other platforms expand
it). Rows or columns past the last offset belong to no group and come out zero (CUDA's
kernel leaves them unwritten). Products accumulate in float32 for 16-bit operands, as
torch's kernels do, and `out_dtype` casts the result. A bias is refused, as CPU's and
CUDA's kernels refuse it.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .. import _precision as precision
from .. import _runtime
from .._runtime import jax_dtype
from .linalg import _matmul
from .registry import aten, lowering


def meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The result's shape, dtype and layout, on meta or fake tensors. torch's meta function
    copies the CUDA kernel's checks and refuses every dtype but bfloat16, while the op (CPU's
    kernel, ATen's composite one) takes the other float dtypes: other float operands are
    shaped at bfloat16 and the result takes their dtype. Eager ops (op/opcall.py) and
    torch.compile's fake tensors (compile/fakes.py) both ask here."""
    if mat_a.dtype == mat_b.dtype and mat_a.dtype.is_floating_point and \
            mat_a.dtype != torch.bfloat16:
        wide = mat_a.dtype
        out = aten._grouped_mm.default(
            mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16), offs=offs,
            bias=None if bias is None else bias.to(torch.bfloat16))
        return out.to(wide if out_dtype is None else out_dtype)
    return aten._grouped_mm.default(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)


def _sizes(offs):
    offs = offs.astype(jnp.int32)
    return jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))


def _ragged(lhs, rhs, offs, lhs_ragged, rhs_group, contracting):
    dims = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(contracting, ((), ())),
        lhs_ragged_dimensions=[lhs_ragged], rhs_group_dimensions=rhs_group)
    half, acc = lhs.dtype in (jnp.bfloat16, jnp.float16), None
    prec = precision.for_matmul(lhs.dtype)
    if half and _runtime.platform() == "cpu":
        # XLA:CPU has no 16-bit dot with a float32 result: the operands widen (exactly)
        lhs, rhs = lhs.astype(jnp.float32), rhs.astype(jnp.float32)
    elif half:
        acc = jnp.float32
    return lax.ragged_dot_general(lhs, rhs, _sizes(offs), dims, precision=prec,
                                  preferred_element_type=acc)


@lowering(aten._grouped_mm.default)
@precision.sensitive
def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if bias is not None:  # CPU's and CUDA's kernels' words
        raise RuntimeError("Bias not supported yet")
    if mat_a.dtype != mat_b.dtype:
        raise RuntimeError(f"grouped_mm: mat_a and mat_b must have the same dtype, got "
                           f"{mat_a.dtype} and {mat_b.dtype}")
    if mat_a.ndim == 3 and mat_b.ndim == 3:
        out = _matmul(mat_a, mat_b)
    elif offs is None:
        raise RuntimeError("grouped_mm: offs is required when mat_a or mat_b is 2-D")
    elif mat_a.ndim == 2 and mat_b.ndim == 3:  # rows of a in groups
        out = _ragged(mat_a, mat_b, offs, 0, [0], ((1,), (1,)))
    elif mat_a.ndim == 3 and mat_b.ndim == 2:  # columns of b in groups: the transpose
        out = _ragged(mat_b.T, jnp.swapaxes(mat_a, 1, 2), offs, 0, [0], ((1,), (1,))).T
    else:  # 2-D x 2-D: the contracted dimension in groups, one product per group
        out = _ragged(mat_a, mat_b, offs, 1, [], ((1,), (0,)))
    return out.astype(mat_a.dtype if out_dtype is None else jax_dtype(out_dtype))
