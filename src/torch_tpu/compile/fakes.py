"""Fake (shape) kernels for tpu tensors where torch's meta function states a CUDA kernel's
limits rather than the op's: dynamo traces with fake tensors, and such a meta function
refuses a graph that tpu runs.

- `aten::_grouped_mm` (F.grouped_mm, transformers' mixture-of-experts layers): the meta
  function copies `_grouped_mm_cuda`'s checks and refuses any dtype but bfloat16, while
  the op itself (ATen's composite kernel, which tpu runs, and CPU's) takes float32 and the
  other float dtypes. transformers calls it on tpu for every dtype under torch.compile
  (its `_can_use_grouped_mm`), so a float32 MoE model failed to compile ("RuntimeError
  when making fake tensor call"). For tpu inputs of another float dtype, the shape comes
  from the meta function at bfloat16 and the result takes the op's own dtype.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


def _on_tpu(*xs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in xs)


def _grouped_mm(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if (not _on_tpu(mat_a, mat_b) or mat_a.dtype == torch.bfloat16
            or not mat_a.dtype.is_floating_point or mat_a.dtype != mat_b.dtype):
        return NotImplemented  # torch's own meta function decides
    bf16 = torch.bfloat16
    with fake_mode:
        out = func(mat_a.to(bf16), mat_b.to(bf16), offs=offs,
                   bias=None if bias is None else bias.to(bf16))
        return out.to(out_dtype or mat_a.dtype)


def register() -> None:
    """Once, before dynamo traces (compile.setup_dynamo)."""
    from torch._subclasses.fake_impls import register_op_impl

    register_op_impl(aten._grouped_mm.default)(_grouped_mm)
