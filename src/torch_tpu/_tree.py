"""One converter for argument trees: an op's arguments moved to another device (the host
for the CPU fallback and Debug's CPU check, meta for shape inference)."""
from __future__ import annotations

import torch


def convert(v, tensor, device: torch.device):
    """`v` with each tensor `t` replaced by `tensor(t)`, each tpu device by `device` and
    each tpu generator by None (the target runs with its own default generator), through
    lists and tuples; everything else as it is."""
    if isinstance(v, torch.Tensor):
        return tensor(v)
    if isinstance(v, (list, tuple)):
        return type(v)(convert(x, tensor, device) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return device
    if isinstance(v, torch.Generator) and v.device.type == "tpu":
        return None
    return v


_META = torch.device("meta")


def _meta_tensor(t):
    if t.device.type == "meta":
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def to_meta(v):
    """`v` with its tensors as meta tensors of the same shapes, strides and dtypes (shape
    inference, and torch's own checks of the arguments)."""
    return convert(v, _meta_tensor, _META)
