"""How close a tpu result must be to the same op run by PyTorch on CPU, per result dtype.

One table for the two places that compare an op with CPU: Debug mode's CPU shadow check
(eager/debug.py) and the validation sweeps (validation/tolerances.py builds its gradient
and model tolerances on it). A leaf module, so that eager/debug.py reads it without
importing the validation tool package.

Why above torch.testing's defaults: those compare a kernel with itself, while here XLA:CPU
evaluates transcendental functions with its own polynomial approximations, reorders
reductions, and (as TPUs do) may keep a 16-bit result's float32 intermediates where torch
rounds after each step. So a 16-bit result may sit two rounding steps from CPU's, and both
16-bit floats get rtol = 2 eps: bfloat16's eps is 2**-7, so 1.6e-2 (torch's own bf16 rtol);
float16's is 2**-10, so 2e-3 (torch's 1e-3 is one eps, which a second rounding step already
exceeds, and would make Debug raise on correct code). atol is one eps of the dtype at
magnitude 1, for results near zero from cancellation (bf16's 1e-2 rather than 7.8e-3: the
bfloat16 sweep results in docs/validation were judged with it). Debug scales atol by the
result's largest magnitude; the sweeps use it as is.
"""
from __future__ import annotations

import torch

# result dtype -> (rtol, atol); a dtype not listed (integers, bool) must match exactly
BY_DTYPE = {
    torch.float64: (1e-7, 1e-7), torch.complex128: (1e-7, 1e-7),  # torch.testing's
    torch.float32: (1e-4, 1e-5), torch.complex64: (1e-4, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}
