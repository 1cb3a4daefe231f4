"""Adapters for libraries that pick their device from a fixed list of in-tree backends.

Each adapter is applied lazily, when its library is imported, so that `import torch_tpu`
imports none of them. generation: HF generate() on tpu at bucketed shapes; trainer: HF
Trainer's batches at bucketed lengths; collators: HF's padding collators at bucketed
lengths in any loop on tpu; lightning: PyTorch Lightning's Trainer and Fabric on
tpu without torch_xla; trl: TRL's GRPO and RLOO completions padded to bounded
lengths."""
from __future__ import annotations

from . import accelerate, collators, generation, lightning, trainer, trl


def install() -> None:
    accelerate.install()
    collators.install()
    generation.install()
    lightning.install()
    trainer.install()
    trl.install()
