"""Device memory as CUDA reports it: the capacity, the per-process limit, the counters and
`torch.OutOfMemoryError`.

The counting lives in the allocator (csrc/memory.cpp), which every tpu storage passes
through: a storage's bytes are *reserved* when torch allocates it and *allocated* once its
XLA buffer exists (in DeferAndFuse, at the flush that computes it). The limit bounds what
is reserved, so an allocation past it raises `torch.OutOfMemoryError` at the torch call
that makes the tensor (a factory, an op's result, a recorded op in DeferAndFuse), before
XLA touches any memory, and the process goes on. XLA's own RESOURCE_EXHAUSTED becomes the
same error (_runtime.raise_if_out_of_memory). This module decides the capacity and answers
torch.tpu's memory functions from the allocator's counters, the ones torch.accelerator's
memory functions read too (the allocator is a c10::DeviceAllocator).

The capacity (`get_device_properties().total_memory`, `mem_get_info()[1]`):
  TPU, GPU  the device's memory as PJRT reports it (`bytes_limit`); TORCH_TPU_MEMORY_LIMIT
            can lower it.
  XLA:CPU   a budget: TORCH_TPU_MEMORY_LIMIT, else half the memory the host lets this
            process use (physical RAM, or the cgroup limit when lower), split among the
            local processes of a torchrun job. Half, because on XLA:CPU the device's
            memory is the host's, and the other half is for what the count does not see:
            host tensors and Python, every XLA program's temporaries, compiled
            executables, and the new buffer each write to a storage makes before the old
            one dies (XLA buffers are immutable: an in-place update that cannot donate
            holds the storage twice for a moment).
`set_per_process_memory_fraction(f)` lets this process reserve f x the capacity, as on CUDA.
The capacity is learned when the first tpu storage with bytes is allocated, which starts
the device, as CUDA's first allocation initializes CUDA.
"""
from __future__ import annotations

import os

import torch

from . import _C, _config, _runtime

_state = {"capacity": None, "fraction": 1.0, "hint": ""}


def host_memory() -> int:
    """Bytes of memory this process may use on the host: physical RAM, or the cgroup's
    limit when lower (a container's)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _reported(device) -> int | None:
    """The device's memory as PJRT reports it; None on XLA:CPU, which reports none."""
    try:
        stats = device.memory_stats() or {}
    except (RuntimeError, NotImplementedError):  # (a plugin without memory statistics)
        stats = {}
    return stats.get("bytes_limit") or None


def _learn() -> None:
    """The allocator's first allocation asks for the capacity (csrc/memory.cpp)."""
    device = _runtime.device()
    setting = _config.get("TORCH_TPU_MEMORY_LIMIT")
    reported = _reported(device)
    free_some = "free tensors you no longer need (del x; gc.collect() also frees those in "
    if reported is not None:
        capacity = reported if setting is None else min(setting, reported)
        hint = (f"To go on, {free_some}reference cycles) or use smaller batches.")
    else:
        local_processes = _C.local_device()[1]
        capacity = setting if setting is not None else host_memory() // 2 // local_processes
        now = "unset: half the host's memory" if setting is None else "now " + _fmt(capacity)
        hint = (f"To go on, {free_some}reference cycles), or give the device more of the "
                f"host's memory with TORCH_TPU_MEMORY_LIMIT ({now}).")
    _state["capacity"], _state["hint"] = int(capacity), hint
    _publish()


def _publish() -> None:
    capacity = _state["capacity"]
    _C.set_memory_capacity(capacity, int(capacity * _state["fraction"]), _state["hint"])


def _fmt(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"


_C.set_capacity_callback(_learn)


def capacity() -> int:
    """The device's memory in bytes (starts the device the first time)."""
    if _state["capacity"] is None:
        _learn()
    return _state["capacity"]


# ---------------------------------------------------------------- torch.tpu's functions
def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes: the capacity less what live tpu tensors hold or, in
    DeferAndFuse, will hold at the next flush (torch.accelerator.get_memory_info agrees)."""
    total = capacity()
    return max(0, total - _C.memory_reserved(_index(device))), total


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Let this process reserve `fraction` x the capacity; an allocation past it raises
    torch.OutOfMemoryError (tensors already past it stay)."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    capacity()
    _state["fraction"] = fraction
    _publish()


def get_per_process_memory_fraction(device=None) -> float:
    return _state["fraction"]


def memory_allocated(device=None) -> int:
    """Bytes of the tpu storages whose XLA buffer exists (DeferAndFuse's pending results
    count once their flush has run)."""
    return _C.memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes of every live tpu storage, pending DeferAndFuse results included: what the
    capacity bounds."""
    return _C.memory_reserved(_index(device))


def _index(device) -> int:
    """A device argument's index: -1 (the current device) for None or "tpu"; each device of
    a process that has several is counted apart, one device under any name."""
    if device is None:
        return -1
    if isinstance(device, (str, torch.device)):
        device = torch.device(device)
        return -1 if device.index is None else device.index
    return int(device)


# `device`: one of this process's devices, by any name (docs/DEVICES.md)
def memory_stats(device=None) -> dict:
    """CUDA's statistics (`allocated_bytes.all.current`, `reserved_bytes.all.peak`,
    `num_ooms`, ...), as torch.accelerator.memory_stats gives them. Only the `all` pool is
    counted: XLA has no small and large pools."""
    return dict(torch.accelerator.memory_stats(device))


def max_memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(device)


reset_max_memory_allocated = reset_peak_memory_stats


def empty_cache() -> None:
    """XLA frees a buffer when its storage dies; there is no cache to empty."""


PUBLIC = ["mem_get_info", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
          "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
          "memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
          "reset_max_memory_allocated", "empty_cache"]
