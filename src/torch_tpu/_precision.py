"""The float32 precision of matrix products and convolutions: what XLA is told.

A TPU's matrix unit multiplies bfloat16; a float32 product is made of bfloat16 passes, and
XLA's `precision` on each dot and convolution (StableHLO `precision = [P, P]`) says how many:

  torch setting  XLA        on a TPU                                 torch's meaning
  "highest"      HIGHEST    6 bfloat16 passes: float32 accuracy      float32 (the default)
  "high"         HIGH       3 bfloat16 passes (bf16_3x, ~16 bits)    TF32 or bf16x3
  "medium"       DEFAULT    1 bfloat16 pass (8 mantissa bits)        bfloat16

XLA:CPU computes float32 in float32 at every precision (lax.Precision's own doc), so here
the setting changes the program text and its cache key, not the values. Operands already
16-bit (bfloat16, float16) or integer get no precision attribute: one pass is exact for
them, and their programs do not depend on the setting.

What decides, innermost first:
  - `torch.tpu.precision(p)` (a thread-local context, the reference system's spelling):
    every product and convolution in the block;
  - products (mm, bmm, addmm, linear, matmul, einsum, baddbmm, SDPA, ...):
    `torch.set_float32_matmul_precision`, which `torch.backends.tpu.matmul.allow_tf32` and
    `.fp32_precision` also set (_backends.py);
  - convolutions: cuDNN's switches under their tpu name, `torch.backends.tpudnn`:
    `allow_tf32 = False` or `fp32_precision = "ieee"` force full float32, `"tf32"` is
    "high"; otherwise (allow_tf32 True, cuDNN's default) a convolution follows the matmul
    precision, so the default is full float32 and one `set_float32_matmul_precision`
    speeds up a whole model.

The precision is part of every program key (`_program_cache` says how for each cache): an
op whose lowering is marked here (`@sensitive`) keys its eager entry by `snapshot()`, the
(matmul, convolution) settings in force when it was called, and its program is traced
with that snapshot `bound`, so a DeferAndFuse graph flushed later, outside the block,
keeps it; a compiled program keys and binds it as a whole. Changing a setting compiles
new programs; setting it back finds the old ones.
"""
from __future__ import annotations

import contextlib
import sys
import threading

import torch
from jax import lax

MATMUL, CONV = "matmul", "conv"
_XLA = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH,
        "medium": lax.Precision.DEFAULT}
# the names a user may pass to torch.tpu.precision, as torch spells its three settings
_ALIASES = {"highest": "highest", "float32": "highest", "ieee": "highest", "fp32": "highest",
            "high": "high", "tf32": "high", "bf16_3x": "high", "bfloat16_3x": "high",
            "medium": "medium", "default": "medium", "bf16": "medium", "bfloat16": "medium",
            "fastest": "medium"}
_CONV_FP32 = {"ieee": "highest", "tf32": "high", "bf16": "medium"}

class _Local(threading.local):
    # class defaults: a missing thread-local attribute costs ~2 us to look up (it raises)
    override = None   # torch.tpu.precision's setting on this thread
    bound = None      # the snapshot a program is being traced with


_local = _Local()
SENSITIVE: set = set()       # the lowerings whose programs depend on the settings


def sensitive(fn):
    """Mark a lowering that calls for_matmul or for_conv: its programs are keyed by the
    precision (a lowering that calls them unmarked would keep a stale one: see
    tests/ops/test_precision.py, which checks every lowering of the product families)."""
    SENSITIVE.add(fn)
    return fn


def canonical(p) -> str:
    """'highest' | 'high' | 'medium' for any accepted spelling (or a lax.Precision)."""
    if isinstance(p, lax.Precision):
        return {lax.Precision.HIGHEST: "highest", lax.Precision.HIGH: "high",
                lax.Precision.DEFAULT: "medium"}[p]
    name = _ALIASES.get(str(p).lower()) if isinstance(p, str) else None
    if name is None:
        raise ValueError(f"torch.tpu.precision: unknown precision {p!r}; expected one of "
                         f"'highest', 'high', 'medium' (or {sorted(set(_ALIASES) - set(_XLA))})")
    return name


_matmul_setting = torch._C._get_float32_matmul_precision  # torch.get_float32_... without a frame


def _conv_setting(mm):
    dnn = sys.modules.get("torch.backends.tpudnn")  # _backends.py's module
    if dnn is None:
        return mm
    fixed = _CONV_FP32.get(getattr(dnn, "fp32_precision", "none"))
    if fixed is not None:
        return fixed
    return mm if getattr(dnn, "allow_tf32", True) else "highest"


def current(kind: str = MATMUL) -> str:
    """The setting in force on this thread now for a product (MATMUL) or convolution."""
    override = _local.override
    if override is not None:
        return override
    mm = _matmul_setting()
    return mm if kind == MATMUL else _conv_setting(mm)


def snapshot() -> tuple:
    """(matmul, conv) settings now: the key part of a precision-sensitive program. Read
    for every product eager runs: ~0.5 us."""
    override = _local.override
    if override is not None:
        return override, override
    mm = _matmul_setting()
    return mm, _conv_setting(mm)


@contextlib.contextmanager
def precision(p):
    """`torch.tpu.precision("highest" | "high" | "medium")`: products and convolutions
    in the block use this precision on this thread, whatever the global settings say."""
    name = canonical(p)
    old = _local.override
    _local.override = name
    try:
        yield
    finally:
        _local.override = old


@contextlib.contextmanager
def bound(setting):
    """While a program is traced: the lowerings read `setting` (a snapshot()) instead of
    the live settings (see the module doc)."""
    old = _local.bound
    _local.bound = setting
    try:
        yield
    finally:
        _local.bound = old


def binding(fn, setting):
    """`fn` (a traceable body) that traces with `setting` bound."""
    def bound_fn(*args):
        with bound(setting):
            return fn(*args)

    bound_fn.__name__ = bound_fn.__qualname__ = getattr(fn, "__name__", "run")
    return bound_fn


def _setting(kind):
    b = _local.bound
    if b is None:
        return current(kind)
    return b[0] if kind == MATMUL else b[1]


_FULL = ("float32", "float64", "complex64", "complex128")


def for_matmul(dtype):
    """The `precision=` of a product whose operands have `dtype` (None: XLA's default,
    for operands that one bfloat16 pass multiplies exactly)."""
    return _XLA[_setting(MATMUL)] if str(dtype) in _FULL else None


def for_conv(dtype):
    """The `precision=` of a convolution of `dtype` operands (see for_matmul)."""
    return _XLA[_setting(CONV)] if str(dtype) in _FULL else None
