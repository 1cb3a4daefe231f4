"""HF's padding collators at bucketed lengths in any loop, once the process uses tpu.

A user's own loop (`DataLoader(ds, collate_fn=DataCollatorWithPadding(tokenizer))`, then
`batch.to("tpu")`) meets a new sequence length at almost every step, as Trainer does
(trainer.py), and on tpu each new length compiles a program set. So the collators that
pad with a mask (`DataCollatorWithPadding`, `DataCollatorForSeq2Seq`,
`DataCollatorForLanguageModeling`, `DataCollatorForTokenClassification`) pad each batch
further, to its length's bucket, when this process has started the tpu device (or is a
loader worker forked from one that has): a CPU-only run with torch_tpu installed keeps its
batches as they were. The padding is the collator's own (its tokenizer's pad token and
side, mask 0, labels -100: `_buckets.pad_masked_batch`); a batch without an attention mask
is left as it is, and so is a collator whose user chose its lengths (`padding="max_length"`,
`pad_to_multiple_of`). Under Trainer, its loaders' wrapper pads the same way, so a batch is
padded once. A `pad_sequence` collate_fn the user wrote is not touched: nothing says which
of its tensors a model masks.

Each wrapper is a `_patches.Patch` with the signature of what it wraps in transformers
5.24.0, installed when `transformers.data.data_collator` is first executed
(`_on_import`); TORCH_TPU_BUCKETED_COLLATORS=0 turns them off.
"""
from __future__ import annotations

from .. import _buckets, _config, _on_import, _patches, _runtime
from .._patches import Patch

WRITTEN_AGAINST = "5.24.0"
_MODULE = "transformers.data.data_collator"


def _bucketed(collator, batch):
    if not (_runtime.started() or _runtime.in_bad_fork()) or _buckets.lengths_chosen(collator) \
            or not _config.get("TORCH_TPU_BUCKETED_COLLATORS"):
        return batch
    tokenizer = getattr(collator, "tokenizer", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor holds one
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        return batch
    return _buckets.pad_masked_batch(batch, pad, getattr(tokenizer, "padding_side", "right"))


def _wrap(original):
    def collate(self, *args, **kwargs):
        return _bucketed(self, original(self, *args, **kwargs))
    return collate


_WHY = "dynamic padding: a program set per batch length on tpu"
PATCHES = [
    Patch(f"{_MODULE}:DataCollatorWithPadding.__call__",
          "(self, features: list[dict[str, typing.Any]]) -> dict[str, typing.Any]", _wrap, _WHY),
    Patch(f"{_MODULE}:DataCollatorForSeq2Seq.__call__", "(self, features, return_tensors=None)",
          _wrap, _WHY),
    Patch(f"{_MODULE}:DataCollatorForLanguageModeling.torch_call",
          "(self, examples: list[list[int] | typing.Any | dict[str, typing.Any]]) "
          "-> dict[str, typing.Any]", _wrap, _WHY),
    Patch(f"{_MODULE}:DataCollatorForTokenClassification.torch_call", "(self, features)",
          _wrap, _WHY),
]


def _patch() -> None:
    _patches.apply_all(PATCHES, f"transformers' collators (written against {WRITTEN_AGAINST}) "
                       "are left unpatched: dynamically padded batches compile per length on tpu")


def install() -> None:
    """Patch transformers' collators now if they are loaded, else as soon as they are."""
    _on_import.when_imported(_MODULE, _patch,
                             lambda m: hasattr(m, "DataCollatorForTokenClassification"))
