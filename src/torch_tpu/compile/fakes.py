"""Fake (shape) kernels for tpu tensors where torch's meta function states a CUDA kernel's
limits rather than the op's: dynamo traces with fake tensors, and such a meta function
would refuse a graph that tpu runs.

- `aten::_grouped_mm` (F.grouped_mm, transformers' mixture-of-experts layers, which call
  it on tpu for every dtype under torch.compile): a float32 MoE model failed to compile
  ("RuntimeError when making fake tensor call"). The rule is lowering/grouped_mm.meta,
  the one eager ops use too.
"""
from __future__ import annotations

import torch

from ..lowering import grouped_mm

aten = torch.ops.aten


def _on_tpu(*xs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in xs)


def _grouped_mm(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    # bfloat16 goes to torch's own meta function: meta() asks the op again at bfloat16,
    # which would come back here
    if not _on_tpu(mat_a, mat_b) or mat_a.dtype == torch.bfloat16:
        return NotImplemented
    with fake_mode:
        return grouped_mm.meta(mat_a, mat_b, offs, bias, out_dtype)


def register() -> None:
    """Once, before dynamo traces (compile.setup_dynamo)."""
    from torch._subclasses.fake_impls import register_op_impl

    register_op_impl(aten._grouped_mm.default)(_grouped_mm)
