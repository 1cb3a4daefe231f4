"""Bucket sizes: the capacities that work whose sizes vary is compiled at (issue 15).

A size n runs at the smallest bucket that holds it, so a dimension that takes many values
costs one program per bucket, not one per size. The buckets are the list given to
`torch_tpu.set_buckets` (or `TORCH_TPU_BUCKETS`), and past its largest entry, or with no
list, the powers of two from `MIN_BUCKET` up. Used by HF generation on tpu
(`_integrations/generation.py`), by `torch_tpu.pad_to_bucket` for training batches, and
by HF Trainer's data loaders on tpu (`_integrations/trainer.py`);
docs/DYNAMIC_SHAPES.md says how to pick them.
"""
from __future__ import annotations

import torch

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


def pad_to_bucket(batch, *, pad_token_id: int = 0, label_pad_id: int = -100, dim: int = -1,
                  side: str = "right"):
    """A batch padded along `dim` (the sequence) to its length's bucket, so that training on
    batches of many lengths compiles one program set per bucket.

    `batch` is a tensor (padded with 0) or an HF-style dict of tensors sharing that length:
    `input_ids` are padded with `pad_token_id`, `labels` with `label_pad_id` (ignored by the
    loss), a `special_tokens_mask` with 1, everything else laid out as `input_ids` with 0,
    and an `attention_mask` (ones where there was none) with 0, so a model that honours the
    mask and a loss that ignores -100 compute what the unpadded batch gives. `side` is the
    tokenizer's padding side (left for batches padded on the left). Pad the batch on the
    host (in the collator, before `.to(device)`): padding a tpu tensor is itself an op of
    the unpadded shape."""
    if side not in ("left", "right"):
        raise ValueError(f"torch_tpu.pad_to_bucket: side must be 'left' or 'right', got {side!r}")
    if torch.is_tensor(batch):
        return _pad(batch, dim, 0, side)
    if not torch.is_tensor(batch.get("input_ids")):
        raise ValueError("torch_tpu.pad_to_bucket: a dict batch needs an 'input_ids' tensor "
                         f"(its length is the one padded); got keys {sorted(batch)}")
    ids = batch["input_ids"]
    dim = dim % ids.dim()
    padded = dict(batch)
    if "attention_mask" not in padded:
        padded["attention_mask"] = torch.ones_like(ids)
    values = {"input_ids": pad_token_id, "labels": label_pad_id, "special_tokens_mask": 1}
    for key, value in padded.items():
        if _carries_sequence(value, ids.shape, dim):
            padded[key] = _pad(value, dim, values.get(key, 0), side)
    return type(batch)(padded) if not isinstance(batch, dict) else padded


def pad_masked_batch(batch, pad_token_id: int, side: str):
    """`pad_to_bucket` for a collator's batch that has `input_ids` and an attention mask;
    any other batch as it is (without a mask, padding could change the result)."""
    if not hasattr(batch, "get") or not torch.is_tensor(batch.get("attention_mask")) \
            or not torch.is_tensor(batch.get("input_ids")):
        return batch
    return pad_to_bucket(batch, pad_token_id=pad_token_id, side=side)


def lengths_chosen(collator) -> bool:
    """Whether an HF collator pads to lengths its user chose (`padding="max_length"`, or a
    `pad_to_multiple_of`): its batches' lengths are bounded already, and left as they are."""
    padding = getattr(collator, "padding", None)
    return getattr(padding, "value", padding) == "max_length" \
        or getattr(collator, "pad_to_multiple_of", None) is not None


def _carries_sequence(t, ids_shape, dim: int) -> bool:
    """Whether `t` is laid out as input_ids, and so carries the sequence at `dim`: it has
    input_ids' leading dims (a size-1 dim broadcasts, as `position_ids` of `[1, S]` does),
    maybe more after them (`[B, S, H]` embeddings). A `[B]` tensor of per-example labels
    does not, even when B equals the sequence length."""
    if not torch.is_tensor(t) or t.dim() < len(ids_shape):
        return False
    return t.shape[dim] == ids_shape[dim] and all(
        t.shape[i] in (n, 1) for i, n in enumerate(ids_shape) if i != dim)


def _pad(t, dim: int, value, side: str = "right"):
    extra = bucket(t.shape[dim]) - t.shape[dim]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    fill = t.new_full(shape, value)
    return torch.cat([t, fill] if side == "right" else [fill, t], dim=dim)
