"""Bucket sizes (torch_tpu/_buckets.py) and the generation, Trainer and TRL adapters' patches
(torch_tpu/_integrations/): still matching the transformers and TRL they were written for.
tests/models/test_generate_buckets.py and test_trainer_padding.py run them end to end."""
import importlib
import inspect

import pytest
import transformers
import transformers.generation.utils  # noqa: F401  (installs the adapter's patches)
import transformers.trainer  # noqa: F401  (installs the Trainer adapter's patch)
import transformers.data.data_collator  # noqa: F401  (installs the collators' patches)

import torch_tpu
from torch_tpu import _buckets
from torch_tpu._integrations import collators, generation, trainer, trl


def test_powers_of_two_by_default(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_BUCKETS", raising=False)
    assert [_buckets.bucket(n) for n in (1, 16, 17, 264, 512, 513)] == [16, 16, 32, 512, 512, 1024]


def test_a_bucket_list_then_powers_of_two_past_it(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_BUCKETS", "100, 300")
    assert [_buckets.bucket(n) for n in (5, 100, 101, 300, 301)] == [100, 100, 300, 300, 512]
    torch_tpu.set_buckets([48, 24])  # the API wins over the environment, in any order
    try:
        assert [_buckets.bucket(n) for n in (5, 30, 49)] == [24, 48, 64]
    finally:
        torch_tpu.set_buckets(None)
    assert _buckets.bucket(5) == 100


def test_bad_buckets_name_the_problem():
    with pytest.raises(ValueError, match="positive sizes"):
        torch_tpu.set_buckets([0, 8])


def test_pad_to_bucket_pads_an_hf_batch_so_the_loss_ignores_the_padding(monkeypatch):
    import torch

    monkeypatch.delenv("TORCH_TPU_BUCKETS", raising=False)
    ids = torch.arange(1, 2 * 20 + 1).view(2, 20)
    batch = torch_tpu.pad_to_bucket({"input_ids": ids, "labels": ids.clone(), "n": 3},
                                    pad_token_id=7)
    assert batch["input_ids"].shape == (2, 32) and (batch["input_ids"][:, 20:] == 7).all()
    assert (batch["labels"][:, 20:] == -100).all() and torch.equal(batch["labels"][:, :20], ids)
    assert batch["attention_mask"].sum(1).tolist() == [20, 20] and batch["n"] == 3
    assert torch_tpu.pad_to_bucket(torch.ones(3, 16)).shape == (3, 16)  # already a bucket
    with pytest.raises(ValueError, match="input_ids"):
        torch_tpu.pad_to_bucket({"labels": ids})


def test_pad_to_bucket_pads_only_what_carries_the_sequence(monkeypatch):
    """Batch size equal to the sequence length: the per-example labels of a classifier
    ([B]) stay as they are; a [1, S] position_ids and a [B, S, H] embedding are padded
    along the sequence, not along their last dim."""
    import torch

    monkeypatch.delenv("TORCH_TPU_BUCKETS", raising=False)
    ids = torch.ones(20, 20, dtype=torch.long)
    labels = torch.arange(20)
    batch = torch_tpu.pad_to_bucket({"input_ids": ids, "labels": labels,
                                     "position_ids": torch.arange(20)[None],
                                     "inputs_embeds": torch.ones(20, 20, 5)})
    assert batch["input_ids"].shape == (20, 32) and batch["attention_mask"].shape == (20, 32)
    assert batch["labels"] is labels
    assert batch["position_ids"].shape == (1, 32) and batch["inputs_embeds"].shape == (20, 32, 5)


@pytest.mark.parametrize("patch", generation.PATCHES + trainer.PATCHES + collators.PATCHES,
                         ids=lambda p: p.target)
def test_written_against_this_transformers(patch):
    """A new transformers must be read against the wrapped code before the pin moves: the
    bucketed loop reproduces `_sample`'s steps; Trainer's loaders read `self.data_collator`."""
    assert transformers.__version__ == generation.WRITTEN_AGAINST == trainer.WRITTEN_AGAINST \
        == collators.WRITTEN_AGAINST
    owner, name = patch.owner_and_name()
    assert inspect.getattr_static(owner, name)._tpu_patch is patch
    assert patch.current_signature() == patch.signature


@pytest.mark.parametrize("patch", trl.PATCHES, ids=lambda p: p.target)
def test_written_against_this_trl(patch):
    """A new TRL must be read against its configs' `pad_to_multiple_of` handling."""
    library = importlib.import_module("trl")
    importlib.import_module(patch.target.partition(":")[0])  # (installs the patch)
    assert library.__version__ == trl.WRITTEN_AGAINST
    owner, name = patch.owner_and_name()
    assert inspect.getattr_static(owner, name)._tpu_patch is patch
    assert patch.current_signature() == patch.signature


def test_trl_auto_padding_is_a_multiple_bounded_by_the_completion_length():
    assert [trl.padding_multiple(n) for n in (1, 6, 64, 65, 1024)] == [1, 6, 64, 64, 64]


def test_bucketed_collator_pads_masked_batches_on_the_tokenizer_side_and_pickles():
    """Trainer's loaders on tpu: a batch with an attention mask is padded to its bucket on
    the tokenizer's side with the model's pad token; one without a mask is left alone; the
    wrapper survives pickling (a loader worker gets a copy)."""
    import pickle

    import torch

    ids = torch.full((2, 20), 5)
    masked = trainer.BucketedCollator(lambda f: {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 9, "left")
    out = masked([])
    assert out["input_ids"].shape == (2, 32) and (out["input_ids"][:, :12] == 9).all()
    assert (out["attention_mask"][:, :12] == 0).all() and (out["attention_mask"][:, 12:] == 1).all()
    bare = trainer.BucketedCollator(lambda f: {"input_ids": ids}, 9, "right")
    assert bare([])["input_ids"] is ids
    copy = pickle.loads(pickle.dumps(trainer.BucketedCollator(dict, 0, "right")))
    assert copy.pad_token_id == 0 and copy.inner is dict


def test_collators_whose_user_chose_the_lengths_are_left_alone():
    """`padding="max_length"` or a `pad_to_multiple_of` bounds the lengths already: neither
    Trainer's loaders nor the collators pad such batches further."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    from torch_tpu._buckets import lengths_chosen

    assert not lengths_chosen(DataCollatorWithPadding(None))
    assert lengths_chosen(DataCollatorWithPadding(None, padding="max_length", max_length=100))
    assert lengths_chosen(DataCollatorWithPadding(None, pad_to_multiple_of=8))
    assert not lengths_chosen(DataCollatorForLanguageModeling(None, mlm=False))
    assert not lengths_chosen(lambda features: features)  # a collate_fn of the user's
