"""TRL's RL trainers on tpu at bounded lengths: completions of any length, few programs.

GRPOTrainer and RLOOTrainer pad each step's prompts and completions to the longest in the
batch, and sampling stops when every completion has met its end token, so the policy's
and the reference model's forward and backward meet a new sequence length at most steps;
on tpu each new length compiles their program set. TRL has the knob for devices that
compile per shape: `pad_to_multiple_of`, whose default "auto" pads to multiples of 128 on
Neuron and nowhere else. Here "auto" on tpu pads to multiples of
min(64, max_completion_length): a completion is at most max_completion_length long, so at
most ceil(max_completion_length / 64) completion lengths, one when it is at most 64. The
padding is TRL's own (pad tokens, masks of 0, losses and metrics computed under the
masks), so the numbers are the unpadded ones. An explicit value, None included, is kept.

The wrapper is a `_patches.Patch` of each config's `__post_init__`, with the signature of
trl 1.16.0, installed when the config's module is first executed (`_on_import`);
TORCH_TPU_BUCKETED_TRAINER=0 turns it off with the Trainer's bucketing.
"""
from __future__ import annotations

from .. import _config, _on_import, _patches
from .._patches import Patch

WRITTEN_AGAINST = "1.16.0"
_CONFIGS = {"trl.trainer.grpo_config": "GRPOConfig", "trl.trainer.rloo_config": "RLOOConfig"}
MAX_MULTIPLE = 64  # the padding multiple past short completions (ceil(max / 64) lengths)


def padding_multiple(max_completion_length: int) -> int:
    return max(1, min(MAX_MULTIPLE, int(max_completion_length)))


def _post_init(original):
    def __post_init__(self):
        auto = self.pad_to_multiple_of == "auto"
        original(self)
        if (auto and self.pad_to_multiple_of is None and self.device.type == "tpu"
                and _config.get("TORCH_TPU_BUCKETED_TRAINER")):
            self.pad_to_multiple_of = padding_multiple(self.max_completion_length)
    return __post_init__


PATCHES = [Patch(f"{module}:{name}.__post_init__", "(self)", _post_init,
                 "completions of new lengths: a program set per length on tpu")
           for module, name in _CONFIGS.items()]


def install() -> None:
    """Patch TRL's GRPO and RLOO configs now if they are loaded, else once they are."""
    for patch, (module, name) in zip(PATCHES, _CONFIGS.items()):
        consequence = (f"TRL's {name} (written against {WRITTEN_AGAINST}) is left unpatched: "
                       "completions of new lengths compile per length on tpu")
        _on_import.when_imported(
            module, lambda patch=patch, consequence=consequence:
            _patches.apply_all([patch], consequence),
            lambda m, name=name: hasattr(m, name))
