"""Every tolerance the sweeps use, in one place.

tpu results are compared with CPU eager's. Forward results of each dtype are held to the
table that Debug mode's CPU shadow check uses too (torch_tpu/_tolerances.py, where the
values are explained); integers and bools must match exactly. The rest here is the sweeps'
own: gradients, random ops and whole models.
"""
from __future__ import annotations

import torch

from torch_tpu._tolerances import BY_DTYPE

# dtype -> (rtol, atol) for forward results
FORWARD = BY_DTYPE

# gradients run a second program (the backward) over the forward's results: twice the
# rounding, so twice the tolerance
GRAD_FACTOR = 2.0

# random ops: tpu's mean may sit this many standard errors from CPU's pooled mean
RANDOM_Z = 6.0
# random ops: CPU's reference is pooled over this many seeds, to estimate the support
RANDOM_SEEDS = 4
# random ops: tpu's [min, max] may exceed CPU's pooled range by this fraction of its width
RANDOM_RANGE_SLACK = 0.25

# models: logits of a 2-layer width-64 network with random weights, in float32
MODEL_LOGITS = (1e-3, 1e-4)
MODEL_GRADS = (1e-2, 1e-4)

# models' training step, judged against a float64 CPU step (training.py), as
# torch._dynamo.utils.same judges backends: tpu's RMSE from float64 may be this many
# times CPU float32's own, plus F64_TOL / 10; tensors under 1000 elements, where noise
# dominates the metric, get the larger multiplier (dynamo's 2 and 3, its default tol)
F64_MULTIPLIER = 2.0
F64_MULTIPLIER_SMALL = 3.0
F64_TOL = 1e-4

# the dynamo benchmark's own training tolerance (referee.py; its check_accuracy), and the
# one of the models its yaml lists under higher_training; its `same()` gives the models
# of use_larger_multiplier_for_smaller_tensor these multipliers at <= 10 and <= 500
# elements
REFEREE_TOL = 1e-2
REFEREE_TOL_HIGHER = 2e-2
REFEREE_LARGER = (10.0, 8.0)


def forward(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for a result of `dtype`; exact for integers and bools."""
    return FORWARD.get(dtype, (0.0, 0.0))


def grad(dtype: torch.dtype) -> tuple[float, float]:
    rtol, atol = forward(dtype)
    return rtol * GRAD_FACTOR, atol * GRAD_FACTOR


def loosest(*dtypes) -> tuple[float, float]:
    """An op computed in a sample's dtype and returned in another (bf16 in, f32 out) is
    held to the looser of the two."""
    pairs = [forward(d) for d in dtypes if d is not None]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)
