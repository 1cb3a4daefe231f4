"""HF Trainer on tpu at bucketed lengths: dynamic padding without a compile per length.

HF's collators pad each batch to its own longest example (`DataCollatorWithPadding`, the
default whenever a tokenizer is given, and the seq2seq and language-modeling ones), so a run
meets a new sequence length at almost every step, and on tpu each new length compiles a
program set: a tiny BERT classifier over 96 examples of 8-128 tokens built 772 programs in
Strict, 39 per new length, 60 s of a 63 s run. CUDA is indifferent to this; an XLA device
is not, and the Trainer user has no line of their own where a batch could be padded.

So `Trainer._get_dataloader` (every train, eval and test loader) is wrapped: on tpu, with
TORCH_TPU_BUCKETED_TRAINER on, the loader's collator is wrapped in `BucketedCollator`,
which pads each batch further, along the sequence, to its length's bucket
(`_buckets.pad_to_bucket`: powers of two from 16, or `torch_tpu.set_buckets`). The padding
is what the collator's own padding is: the model's pad token on the tokenizer's side, an
attention mask of 0, labels of -100 (ignored by the loss), so a model computes on the real
tokens what the unpadded batch gives. A batch without an attention mask is left as it is:
there, padding could change the result; so is a collator whose user chose its lengths
(`padding="max_length"`, `pad_to_multiple_of`). A model with no pad token is left as it is too
(its classifier finds the last token by the pad token). The dataset's examples and the
collator the user passed are unchanged; only the loaders' batches are padded.

The wrapper is a `_patches.Patch` with the signature of what it wraps in transformers
5.24.0, installed when `transformers.trainer` is first executed (`_on_import`).
"""
from __future__ import annotations

from .. import _buckets, _config, _on_import, _patches
from .._patches import Patch

WRITTEN_AGAINST = "5.24.0"
_MODULE = "transformers.trainer"


class BucketedCollator:
    """A collator whose batches come padded along the sequence to their bucket."""

    def __init__(self, inner, pad_token_id: int, side: str):
        self.inner, self.pad_token_id, self.side = inner, pad_token_id, side

    def __call__(self, features):
        return _buckets.pad_masked_batch(self.inner(features), self.pad_token_id, self.side)

    def __getattr__(self, name):  # the collator's own attributes (tokenizer, ...)
        if name.startswith("__") or name == "inner":  # (unpickling in a loader worker)
            raise AttributeError(name)
        return getattr(self.inner, name)


def _pad_token(trainer):
    """(pad token id, padding side) of the model and its tokenizer; None: do not pad."""
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor holds one
    config = getattr(getattr(trainer, "model", None), "config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    if pad is None:
        return None
    return int(pad), getattr(tokenizer, "padding_side", "right") or "right"


def _get_dataloader(original):
    def _get_dataloader(self, *args, **kwargs):
        collator = self.data_collator
        padding = _pad_token(self)
        if (self.args.device.type == "tpu" and padding is not None and collator is not None
                and not isinstance(collator, BucketedCollator)
                and not _buckets.lengths_chosen(collator)
                and _config.get("TORCH_TPU_BUCKETED_TRAINER")):
            self.data_collator = BucketedCollator(collator, *padding)
            try:
                return original(self, *args, **kwargs)
            finally:
                self.data_collator = collator
        return original(self, *args, **kwargs)
    return _get_dataloader


PATCHES = [
    Patch(f"{_MODULE}:Trainer._get_dataloader",
          "(self, dataset: torch.utils.data.dataset.Dataset, description: str, batch_size: int, "
          "sampler_fn: collections.abc.Callable[[torch.utils.data.dataset.Dataset], "
          "torch.utils.data.sampler.Sampler] | None = None, is_training: bool = False, "
          "dataloader_key: str | None = None) -> torch.utils.data.dataloader.DataLoader",
          _get_dataloader, "dynamic padding: a program set per batch length on tpu"),
]


def _patch() -> None:
    _patches.apply_all(PATCHES, f"transformers' Trainer (written against {WRITTEN_AGAINST}) "
                       "is left unpatched: dynamically padded batches compile per length on tpu")


def install() -> None:
    """Patch transformers' Trainer now if it is loaded, else as soon as it is."""
    _on_import.when_imported(_MODULE, _patch, lambda m: hasattr(m, "Trainer"))
