"""ATen's CPU kernels inside XLA:CPU programs, where they beat XLA:CPU's own.

On the CPU platform (JAX with no accelerator, as on this project's machines) XLA:CPU runs
every op of a program with its own kernels, and its bfloat16 dot is ~10x slower than
ATen's (oneDNN on the CPU's AMX / AVX512-BF16 units; csrc/cpu_kernels.cpp has the
figures). `install` wraps jax's XLA:CPU lowering of `dot_general`: a dot whose operands
and result are all bfloat16 lowers to an XLA FFI custom call that runs ATen's mm/bmm on
XLA's own buffers; every other dot keeps XLA's kernel. It works below every mode and
jax transform (vjp, vmap, scan all run before lowering): Strict's per-op programs,
DeferAndFuse's graphs, captured steps and torch.compile's programs alike. Products that
are rounded to bfloat16 anyway (lowering/linalg.py `_mm`: mm, bmm, mv, dot) ask for a
bfloat16 result, which is the same arithmetic as float32 accumulation rounded once.
Unmasked fused attention (lowering/attention.py) calls ATen's CPU flash-attention
kernels the same way, forward and backward, so its values are CPU torch's to the bit.

Only the CPU platform's lowering changes; TPU and GPU programs never see a custom call.
Counted as `cpu_kernels.dot`, `.attention` and `.attention_backward`, each time a program
that has one is lowered (a program traced twice counts twice).
`TORCH_TPU_CPU_ATEN_KERNELS=0` keeps XLA:CPU's kernels everywhere.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from . import _C, _config, _jax_internals, metrics

TARGETS = {"dot": "torch_tpu_cpu_dot", "attention": "torch_tpu_cpu_attention",
           "attention_backward": "torch_tpu_cpu_attention_backward"}
# The dtypes whose products go to ATen. float32 does not: XLA:CPU's float32 dot is within
# ~20% of ATen's (MKL) at the sizes measured, not worth a custom call in every program.
DTYPES = (jnp.dtype(jnp.bfloat16),)
# Attention in every dtype ATen's CPU flash kernel takes: it beats the blocked XLA lowering
# (lowering/attention.py) in each.
ATTENTION_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))

_installed = [False]


def qualifies(lhs, rhs, out) -> bool:
    """Whether a dot of these avals runs on ATen's kernel."""
    return (lhs.dtype == rhs.dtype == out.dtype and lhs.dtype in DTYPES
            and lhs.size > 0 and rhs.size > 0)


def wants_rounded_product(dtype) -> bool:
    """Whether a product of two `dtype` operands that is rounded to `dtype` anyway should
    ask dot_general for a `dtype` result, so that ATen's kernel runs it: on the CPU
    platform, with the kernels installed. (XLA's own dot of that result type accumulates
    in float32 and rounds once too, but runs slower than its float32-result dot.)"""
    return _installed[0] and dtype in DTYPES and _on_cpu()


@functools.cache
def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def attention_qualifies(query, key, value, attn_bias, scale) -> bool:
    """Whether fused attention of these arrays runs on ATen's CPU flash-attention kernels:
    on the CPU platform, with no mask, one dtype, as many key as query heads, one head
    size, and a scale known when the program is traced."""
    return (_installed[0] and _on_cpu() and attn_bias is None
            and query.dtype == key.dtype == value.dtype and query.dtype in ATTENTION_DTYPES
            and query.ndim == key.ndim == value.ndim == 4 and query.shape[1] == key.shape[1]
            and query.shape[-1] == key.shape[-1] == value.shape[-1]
            and query.size > 0 and key.size > 0
            and (scale is None or isinstance(scale, (int, float))))


def _scale(query, scale) -> np.float64:
    return np.float64(1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)


def attention(query, key, value, is_causal, scale):
    """(output, float32 logsumexp [B, H, L]) of ATen's CPU flash attention."""
    metrics.count("cpu_kernels.attention")
    out = jax.ShapeDtypeStruct(query.shape[:-1] + value.shape[-1:], query.dtype)
    lse = jax.ShapeDtypeStruct(query.shape[:-1], jnp.float32)
    return jax.ffi.ffi_call(TARGETS["attention"], (out, lse))(
        query, key, value, is_causal=bool(is_causal), scale=_scale(query, scale))


def attention_backward(grad_out, query, key, value, out, logsumexp, is_causal, scale):
    """(dq, dk, dv) of ATen's CPU flash attention."""
    metrics.count("cpu_kernels.attention_backward")
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (query, key, value))
    return jax.ffi.ffi_call(TARGETS["attention_backward"], shapes)(
        grad_out, query, key, value, out, logsumexp, is_causal=bool(is_causal),
        scale=_scale(query, scale))


def _dims(ds) -> np.ndarray:
    return np.asarray(ds, dtype=np.int64)


def install() -> None:
    """Register the FFI target and the CPU lowering of `dot_general`; once, and not at all
    with TORCH_TPU_CPU_ATEN_KERNELS off."""
    if _installed[0] or not _config.get("TORCH_TPU_CPU_ATEN_KERNELS"):
        return
    _installed[0] = True
    handlers = _C.cpu_kernel_handlers()
    for name, target in TARGETS.items():
        jax.ffi.register_ffi_target(target, handlers[name], platform="cpu")
    xla_rule = _jax_internals.platform_lowering(lax.dot_general_p, "cpu")
    aten_rule = jax.ffi.ffi_lowering(TARGETS["dot"])

    def dot_general(ctx, lhs, rhs, *, dimension_numbers, **params):
        if not qualifies(*ctx.avals_in, ctx.avals_out[0]):
            return xla_rule(ctx, lhs, rhs, dimension_numbers=dimension_numbers, **params)
        metrics.count("cpu_kernels.dot")
        (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
        return aten_rule(ctx, lhs, rhs, lhs_batch=_dims(lhs_batch),
                         lhs_contracting=_dims(lhs_contracting), rhs_batch=_dims(rhs_batch),
                         rhs_contracting=_dims(rhs_contracting))

    mlir.register_lowering(lax.dot_general_p, dot_general, platform="cpu")
