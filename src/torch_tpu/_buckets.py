"""Bucket sizes: the capacities that work whose sizes vary is compiled at (issue 15).

A size n runs at the smallest bucket that holds it, so a dimension that takes many values
costs one program per bucket, not one per size. The buckets are the list given to
`torch_tpu.set_buckets` (or `TORCH_TPU_BUCKETS`), and past its largest entry, or with no
list, the powers of two from `MIN_BUCKET` up. Used by HF generation on tpu
(`_integrations/generation.py`); docs/DYNAMIC_SHAPES.md says how to pick them.
"""
from __future__ import annotations

from . import _config

MIN_BUCKET = 16
_override: tuple[int, ...] | None = None


def _parse(values) -> tuple[int, ...]:
    sizes = sorted({int(v) for v in values})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"buckets must be positive sizes, got {list(values)!r}")
    return tuple(sizes)


def set_buckets(sizes=None) -> None:
    """Compile work whose length varies at these sizes, e.g. `set_buckets([64, 256, 1024])`.
    `None` restores the default: TORCH_TPU_BUCKETS, else powers of two from 16."""
    global _override
    _override = None if sizes is None else _parse(sizes)


def buckets() -> tuple[int, ...]:
    """The configured bucket list (empty: powers of two only)."""
    if _override is not None:
        return _override
    raw = _config.get("TORCH_TPU_BUCKETS")
    return _parse(raw.replace(",", " ").split()) if raw else ()


def bucket(n: int) -> int:
    """The capacity that size `n` runs at."""
    for size in buckets():
        if size >= n:
            return size
    size = MIN_BUCKET
    while size < n:
        size *= 2
    return size
