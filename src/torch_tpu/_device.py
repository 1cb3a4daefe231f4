"""PrivateUse1 registration as `tpu`, and the `torch.tpu` module: counts, seeds, memory
(_memory.py), synchronize, device properties."""
from __future__ import annotations

import sys
import types

import torch

torch.utils.rename_privateuse1_backend("tpu")

from . import _C  # noqa: E402  (the C++ piece: allocator, generator, guard, hooks)
from . import _amp, _backends, _memory, _memory_history, _patches, _runtime, _streams  # noqa: E402
from ._rng import check_state, default_generator  # noqa: E402
from .op import asserts, current  # noqa: E402

_DEFAULT_GENERATOR = default_generator()


# ---------------------------------------------------------------- device
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return not _runtime.in_bad_fork()


# A child forked after XLA started (_runtime.py): torch's seeding in DataLoader workers and
# torch.multiprocessing ask, as they ask CUDA's.
_is_in_bad_fork = _runtime.in_bad_fork


def _lazy_init() -> None:
    _runtime.device()


# This process's device index and the number of devices the job has on this host: under
# torchrun tpu:{LOCAL_RANK} of LOCAL_WORLD_SIZE (the CUDA idiom), else tpu:0 of 1; tpu:0
# always names this process's device too (csrc/tpu_ext.cpp, docs/DEVICES.md).
_OWN_INDEX, _COUNT = _C.local_device()


def device_count() -> int:
    return _COUNT


def current_device() -> int:
    return _OWN_INDEX


def _index(device) -> int:
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return _OWN_INDEX if device.index is None else device.index
    if isinstance(device, str):
        return _index(torch.device(device))
    if device is None:
        return _OWN_INDEX
    return int(device)


def set_device(device) -> None:
    """Select this process's device: tpu:{LOCAL_RANK} under torchrun (or tpu:0, another
    name for it). Any other index raises, naming this process's device."""
    _C.check_device_index(_index(device))


class device:  # noqa: N801  (mirrors torch.cuda.device)
    """Context manager that selects a tpu device (each process has one; see set_device)."""

    def __init__(self, device):
        self.idx = _index(device)
        set_device(self.idx)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def synchronize(device=None) -> None:
    """Wait until every op dispatched so far has finished."""
    _runtime.check_not_forked()
    current.flush_pending("synchronize")
    try:
        for arr in _runtime.jax_live_arrays():
            arr.block_until_ready()
        _runtime.fence()  # and the programs whose results were dropped
    except Exception as e:
        _runtime.check_read(e)
        raise
    _runtime.check_read()
    asserts.check(wait=True)  # device-side asserts (op/asserts.py)


def get_device_name(device=None) -> str:
    d = _runtime.device()
    return f"{d.device_kind} ({d.platform}, via PJRT)"


class _Properties(types.SimpleNamespace):
    def __repr__(self):
        where = f", coords={tuple(self.coords)}" if self.coords is not None else ""
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"device_kind='{self.device_kind}', device_id={self.device_id}{where}, "
                f"total_memory={self.total_memory // 2**20}MB)")


def get_device_properties(device=None):
    """torch's properties, and the runtime device behind the index: its platform, PJRT
    device id, process, and the chip's coordinates and core where the platform has them
    (TPU)."""
    d = _runtime.device()
    return _Properties(name=get_device_name(), platform=d.platform, device_kind=d.device_kind,
                       total_memory=_memory.capacity(), id=d.id, device_id=d.id,
                       process_index=d.process_index, coords=getattr(d, "coords", None),
                       core_on_chip=getattr(d, "core_on_chip", None))


def get_device_capability(device=None):
    return (0, 0)


# ---------------------------------------------------------------- RNG
def manual_seed(seed: int) -> None:
    _DEFAULT_GENERATOR.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    _DEFAULT_GENERATOR.seed()


seed_all = seed


def initial_seed() -> int:
    return _DEFAULT_GENERATOR.initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return _DEFAULT_GENERATOR.get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _DEFAULT_GENERATOR.set_state(check_state(new_state))


def get_rng_state_all():
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


# ---------------------------------------------------------------- autocast
def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ---------------------------------------------------------------- the module
_PUBLIC = [
    "is_available", "is_initialized", "_is_in_bad_fork", "_lazy_init", "device_count",
    "current_device", "set_device", "device", "synchronize", "get_device_name",
    "get_device_properties", "get_device_capability", "manual_seed", "manual_seed_all",
    "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "get_amp_supported_dtype", "is_bf16_supported",
]


def _make_module() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu", "The tpu device: mirrors torch.cuda where it means something.")
    g = globals()
    for name in _PUBLIC:
        setattr(mod, name, g[name])
    # torch.tpu.memory, as torch.cuda.memory: the counters, and the snapshots
    mod.memory = types.ModuleType("torch.tpu.memory", "tpu memory: counters and snapshots.")
    for name in _memory.PUBLIC:
        setattr(mod, name, getattr(_memory, name))
        setattr(mod.memory, name, getattr(_memory, name))
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot", "memory_summary"):
        setattr(mod.memory, name, getattr(_memory_history, name))
    mod.memory_summary = _memory_history.memory_summary
    mod.OutOfMemoryError = torch.OutOfMemoryError  # (torch.cuda.OutOfMemoryError is it too)
    mod._initialized = True
    mod.default_generators = (_DEFAULT_GENERATOR,)
    return mod


def register() -> types.ModuleType:
    mod = _make_module()
    # the rest of torch.cuda's names a script reaches, and torch.backends.tpu / tpudnn
    _streams.install(mod)
    _amp.install(mod)
    _backends.install()
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    torch._register_device_module("tpu", mod)
    sys.modules["torch.tpu"] = mod
    sys.modules["torch.tpu.memory"] = mod.memory
    _C.set_sync_callback(synchronize)
    # Module.to("tpu") must keep tied weights tied (lm_head.weight is embed_tokens.weight):
    # cpu and tpu tensors are not shallow-copy compatible, so without swapping, _apply
    # makes a new Parameter per module.
    torch.__future__.set_swap_module_params_on_conversion(True)
    _patches.apply_at_import()
    return mod
