"""Adapters for libraries that pick their device from a fixed list of in-tree backends.

Each adapter is applied lazily, when its library is imported, so that `import torch_tpu`
imports none of them. generation: HF generate() on tpu at bucketed shapes; trainer: HF
Trainer's batches at bucketed lengths."""
from __future__ import annotations

from . import accelerate, generation, trainer


def install() -> None:
    accelerate.install()
    generation.install()
    trainer.install()
