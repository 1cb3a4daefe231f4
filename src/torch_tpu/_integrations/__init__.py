"""Adapters for libraries that pick their device from a fixed list of in-tree backends.

Each adapter is applied lazily, when its library is imported, so that `import torch_tpu`
imports none of them."""
from __future__ import annotations

from . import accelerate


def install() -> None:
    accelerate.install()
