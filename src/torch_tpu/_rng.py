"""The tpu default generators (torch.tpu.default_generators, one per device): made by the C++ piece,
which also answers torch.Generator(device="tpu"). Seeded ops draw from it when they are
given no generator.

A generator's state is 16 bytes (csrc/tpu_ext.cpp, TpuGeneratorImpl): the seed, then the
offset, each a little-endian uint64. A seeded op draws `fold_in(key(seed), offset)` and
advances the offset by one, so the offset counts the random ops since the seed.
"""
from __future__ import annotations

import torch

from . import _C

_DEFAULTS: dict = {}  # tpu index -> its default generator (one per device, as CUDA's)

STATE_BYTES = 16
SEED_MASK = (1 << 63) - 1   # jax.random.key takes an int64 seed
_U64 = (1 << 64) - 1


def default_generator(index: int | None = None) -> torch.Generator:
    """The default generator of tpu:`index` (None: the current device; under a launcher
    every index names the process's one device)."""
    if index is None:
        index = _C.current_index()
    gen = _DEFAULTS.get(index)
    if gen is None:
        gen = _DEFAULTS[index] = _C.default_generator(index)
    return gen


def check_state(state) -> torch.Tensor:
    """A state for `set_rng_state`, refused as CUDA refuses a bad one (TypeError for a
    tensor that is not uint8, RuntimeError for a wrong size) and also when its offset is
    past 2**63 - 1: no sequence of random ops reaches it, and a state taken from
    `get_rng_state` never has one (16 bytes of 0xFF is such a state)."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise TypeError("RNG state must be a torch.ByteTensor")
    if state.numel() != STATE_BYTES:
        raise RuntimeError(f"RNG state is wrong size: a tpu generator's state is {STATE_BYTES} "
                           f"bytes (a uint64 seed and a uint64 offset), got {state.numel()}")
    state = state.detach().cpu().contiguous()
    offset = int.from_bytes(bytes(state[8:].tolist()), "little")
    if offset > SEED_MASK:
        raise RuntimeError(
            f"RNG state offset {offset} is out of range: the last 8 bytes of a tpu RNG state "
            f"count the random ops drawn since the seed and must be below 2**63 (use a state "
            f"from torch.tpu.get_rng_state(), or torch.tpu.manual_seed)")
    return state


def draw(gen, n: int = 1) -> tuple:
    """(seed, offset) for `n` seeded ops drawing from `gen`, whose offset then advances by
    n. Both fit the int64 values a program takes; a generator given an arbitrary state
    directly (torch.Generator.set_state takes any 16 bytes) wraps around instead of
    breaking every random op after it."""
    offset = gen.get_offset()
    gen.set_offset((offset + n) & _U64)
    return gen.initial_seed() & SEED_MASK, offset & SEED_MASK
