"""The explicit lists: ops that run as torch's own decomposition (into ops we lower), and
ops that run on CPU, each with its reason. Nothing reaches either list by accident."""
from __future__ import annotations

import torch
from torch._decomp.decompositions import native_batch_norm_decomposition

aten = torch.ops.aten

# op -> (decomposition, why it is the right lowering)
_DECOMPOSE = {
    aten.native_batch_norm.default: (
        native_batch_norm_decomposition,
        "nn.BatchNorm reaches native_batch_norm, whose schema does not mark running_mean/"
        "running_var as mutated, so no lowering could write them back; torch's decomposition "
        "redirects to _native_batch_norm_legit(_no_training), which marks them and is lowered"),
}

DECOMPOSITIONS = {op: fn for op, (fn, _why) in _DECOMPOSE.items()}

# op -> why it runs on CPU
CPU_FALLBACKS: dict = {
}
