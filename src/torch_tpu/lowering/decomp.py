"""The explicit lists: ops that run as torch's own decomposition (into ops we lower), and
ops that run on CPU, each with its reason. Nothing reaches either list by accident."""
from __future__ import annotations

import torch
from torch._decomp import decomposition_table

aten = torch.ops.aten

# op -> why a decomposition is the right lowering
_DECOMPOSE = {
}

DECOMPOSITIONS = {op: decomposition_table[op] for op in _DECOMPOSE}

# op -> why it runs on CPU
CPU_FALLBACKS: dict = {
}
