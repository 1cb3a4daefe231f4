"""`torch.backends.tpu` and `torch.backends.tpudnn`: what `torch.backends.cuda` and
`torch.backends.cudnn` become when a script's `cuda` is replaced by `tpu`.

- `torch.backends.tpu.matmul.allow_tf32` (and `.fp32_precision`) is the float32 matmul
  precision, `torch.set_float32_matmul_precision`, which tpu's products read
  (_precision.py): True is "high" (TF32-like accuracy: three bfloat16 passes on a
  TPU), False is "highest" (full float32), exactly as torch maps the CUDA flag.
  XLA:CPU computes float32 products in float32 at every precision.
- `matmul.allow_fp16_reduced_precision_reduction` / `allow_bf16_...`: stored, no effect;
  tpu's 16-bit products always accumulate in float32.
- The SDPA toggles (`enable_flash_sdp`, `sdp_kernel`, ...) are torch's own: process-wide
  flags that only CUDA's kernel choice reads. tpu's attention takes its fused backend
  unless `torch.nn.attention.sdpa_kernel` leaves out every fused one (MATH alone), so on
  tpu they change nothing.
- `torch.backends.tpudnn` (cuDNN's flags; `s/cuda/tpu/` turns `cudnn` into `tpudnn`):
  `allow_tf32` and `fp32_precision` are the float32 convolution precision, which
  _precision.py reads: allow_tf32 True (cuDNN's default) lets convolutions follow the
  matmul precision, False or fp32_precision "ieee" keeps them in full float32, "tf32" is
  "high". XLA has no cuDNN to configure otherwise, so `enabled`, `benchmark`,
  `benchmark_limit` and `deterministic` are stored and read back but change nothing: XLA
  picks its own kernels when it compiles (no run-time autotuning to turn on), and a
  compiled program gives the same result every run on the same input. `is_available()`
  is False and `version()` None, as on a CPU-only torch build.
"""
from __future__ import annotations

import contextlib
import sys
import types

import torch

# torch.backends.cuda.matmul.fp32_precision's names for torch's float32 matmul precisions
_FP32_PRECISION = {"highest": "ieee", "high": "tf32", "medium": "bf16"}


class _Matmul:
    """`torch.backends.tpu.matmul`."""

    allow_fp16_reduced_precision_reduction = True
    allow_bf16_reduced_precision_reduction = True

    @property
    def allow_tf32(self) -> bool:
        return torch.get_float32_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        torch.set_float32_matmul_precision("high" if value else "highest")

    @property
    def fp32_precision(self) -> str:
        return _FP32_PRECISION[torch.get_float32_matmul_precision()]

    @fp32_precision.setter
    def fp32_precision(self, value: str) -> None:
        if value == "none":  # "inherit the global setting": full float32 by default
            value = "ieee"
        names = {v: k for k, v in _FP32_PRECISION.items()}
        if value not in names:
            raise ValueError(f"fp32_precision must be one of {sorted(names) + ['none']}, "
                             f"got {value!r}")
        torch.set_float32_matmul_precision(names[value])


_SDP = ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_math_sdp", "enable_cudnn_sdp",
        "flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
        "cudnn_sdp_enabled", "sdp_kernel", "SDPBackend")


def _tpu_module() -> types.ModuleType:
    mod = types.ModuleType("torch.backends.tpu", "tpu's torch.backends.cuda (torch_tpu._backends).")
    mod.matmul = _Matmul()
    mod.is_built = lambda: True
    for name in _SDP:
        setattr(mod, name, getattr(torch.backends.cuda, name))
    return mod


_DNN_DEFAULTS = {"enabled": True, "benchmark": False, "benchmark_limit": 10,
                 "deterministic": False, "allow_tf32": True, "fp32_precision": "none"}


def _dnn_module() -> types.ModuleType:
    mod = types.ModuleType("torch.backends.tpudnn",
                           "cuDNN's flags, stored with no effect on tpu (torch_tpu._backends).")
    for name, value in _DNN_DEFAULTS.items():
        setattr(mod, name, value)
    mod.is_available = lambda: False
    mod.version = lambda: None
    mod.is_acceptable = lambda tensor: False

    @contextlib.contextmanager
    def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False,
              allow_tf32=True, fp32_precision="none"):
        """torch.backends.cudnn.flags: set the flags for a block, then restore them."""
        new = {"enabled": enabled, "benchmark": benchmark, "benchmark_limit": benchmark_limit,
               "deterministic": deterministic, "allow_tf32": allow_tf32,
               "fp32_precision": fp32_precision}
        old = {name: getattr(mod, name) for name in new}
        for name, value in new.items():
            setattr(mod, name, value)
        try:
            yield
        finally:
            for name, value in old.items():
                setattr(mod, name, value)

    mod.flags = flags
    return mod


def install() -> None:
    """`torch.backends.tpu` and `torch.backends.tpudnn`, importable as modules too."""
    for name, make in (("tpu", _tpu_module), ("tpudnn", _dnn_module)):
        mod = make()
        setattr(torch.backends, name, mod)
        sys.modules[f"torch.backends.{name}"] = mod
