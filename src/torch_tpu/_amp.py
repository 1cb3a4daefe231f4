"""`torch.tpu.amp`: the names of `torch.cuda.amp` (GradScaler, autocast, custom_fwd,
custom_bwd), for scripts whose `cuda` became `tpu`; and tpu's default autocast dtype.

Each name is torch.amp's device-generic object bound to "tpu", as torch.cuda.amp's are
bound to "cuda" (GradScaler's kernels are lowered in lowering/amp.py). Unlike
torch.cuda.amp, nothing here warns of deprecation: a swapped script should not print
warnings its CUDA original printed only because it is old.

The autocast dtype: bfloat16, the TPU's native 16-bit type (torch's own default for the
XLA device too), where torch defaults a PrivateUse1 device to float16. So
`torch.autocast("tpu")` and `torch.tpu.amp.autocast()` compute in bfloat16 unless given
`dtype=`; float16 works when asked for. torch keeps the default per thread and offers no
process-wide setter, so `install` sets it in the importing thread only: another thread
that enters `torch.autocast("tpu")` without `dtype=` gets float16 (`torch.tpu.amp.autocast`
names bfloat16 explicitly and is the same in every thread).
"""
from __future__ import annotations

import functools
import sys
import types

import torch

DEFAULT_DTYPE = torch.bfloat16


class GradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler("tpu", ...)` under torch.cuda.amp.GradScaler's signature."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


class autocast(torch.amp.autocast):  # noqa: N801  (torch.cuda.amp.autocast's name)
    """`torch.autocast("tpu", ...)` under torch.cuda.amp.autocast's signature; the
    default dtype is tpu's (bfloat16), where CUDA's is float16."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = DEFAULT_DTYPE,
                 cache_enabled: bool = True) -> None:
        super().__init__("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """torch.amp.custom_fwd for tpu (torch.cuda.amp.custom_fwd's signature)."""
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """torch.amp.custom_bwd for tpu (torch.cuda.amp.custom_bwd's signature)."""
    return torch.amp.custom_bwd(bwd, device_type="tpu")


def install(module) -> None:
    """`torch.tpu.amp` (importable too: `from torch.tpu.amp import GradScaler`), and the
    bfloat16 default in this thread."""
    amp = types.ModuleType("torch.tpu.amp", __doc__)
    for name in ("GradScaler", "autocast", "custom_fwd", "custom_bwd"):
        setattr(amp, name, globals()[name])
    module.amp = amp
    sys.modules["torch.tpu.amp"] = amp
    torch.set_autocast_dtype("tpu", DEFAULT_DTYPE)
