"""The tpu default generator (torch.tpu.default_generators[0]): made by the C++ piece,
which also answers torch.Generator(device="tpu"). Seeded ops draw from it when they are
given no generator."""
from __future__ import annotations

import torch

from . import _C

_DEFAULT = _C.default_generator()


def default_generator() -> torch.Generator:
    return _DEFAULT
