"""PrivateUse1 registration as `tpu`, and the `torch.tpu` module: counts, seeds, memory
(_memory.py), synchronize, device properties."""
from __future__ import annotations

import sys
import types

import torch

torch.utils.rename_privateuse1_backend("tpu")

from . import _C  # noqa: E402  (the C++ piece: allocator, generator, guard, hooks)
from . import _amp, _backends, _binding, _memory, _memory_history, _patches  # noqa: E402
from . import _runtime, _streams, _waits  # noqa: E402
from ._rng import check_state, default_generator  # noqa: E402
from .op import asserts, current  # noqa: E402


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


# The devices and their indices (csrc/tpu_ext.cpp, docs/DEVICES.md): under a launcher the
# process drives one device, tpu:{LOCAL_RANK} of LOCAL_WORLD_SIZE (the CUDA idiom; tpu:0
# names it too); a process alone drives every local device, tpu:0..N-1, with a current
# device per thread, as CUDA. Decided here, before any storage exists.
if _C.local_device()[1] == 1 and (_ALONE := _binding.devices_alone()) > 1:
    _C.set_multi(_ALONE)


def device_count() -> int:
    return _C.local_device()[1]


def current_device() -> int:
    return _C.current_index()


def _index(device) -> int:
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, str):
        return _index(torch.device(device))
    if device is None:
        return current_device()
    return int(device)


def set_device(device) -> None:
    """Select the current device: any of a process's several, or under a launcher its
    one (tpu:{LOCAL_RANK}, or tpu:0, another name for it). Any other index raises, naming
    the process's devices."""
    _C.set_current_index(_index(device))


class device:  # noqa: N801  (mirrors torch.cuda.device)
    """Context manager that makes a tpu device the current one, then restores the last."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index(device)
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        if self.idx >= 0:
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


def synchronize(device=None) -> None:
    """Wait until every op dispatched so far has finished."""
    _runtime.check_not_forked()
    current.flush_pending("synchronize")
    _waits.begin("torch.tpu.synchronize()")
    try:
        for arr in _runtime.jax_live_arrays():
            arr.block_until_ready()
        _runtime.fence()  # and the programs whose results were dropped
    except Exception as e:
        _runtime.check_read(e)
        raise
    finally:
        _waits.end()
    _runtime.check_read()
    asserts.check(wait=True)  # device-side asserts (op/asserts.py)


def _indices() -> range:
    """The distinct devices' indices: all of a process's several, else its one."""
    return range(device_count()) if _C.multi() else range(current_device(), current_device() + 1)


def _pjrt(device=None):
    """The PJRT device behind a tpu index (None: the current one)."""
    return _runtime.devices()[_index(device)] if _C.multi() else _runtime.device()


def get_device_name(device=None) -> str:
    d = _pjrt(device)
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
    d = _pjrt(device)
    return _Properties(name=get_device_name(device), platform=d.platform,
                       device_kind=d.device_kind, total_memory=_memory.capacity(), id=d.id,
                       device_id=d.id, process_index=d.process_index,
                       coords=getattr(d, "coords", None),
                       core_on_chip=getattr(d, "core_on_chip", None))


def get_device_capability(device=None):
    return (0, 0)


# ---------------------------------------------------------------- RNG
# One default generator per device; the plain functions act on the current device's, the
# _all ones on every device's (torch.cuda's split).
def _generator(device=None) -> torch.Generator:
    return default_generator(None if device is None else _index(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in _indices():
        default_generator(i).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for i in _indices():
        default_generator(i).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _generator(device).set_state(check_state(new_state))


def get_rng_state_all():
    return [get_rng_state(i) for i in _indices()]


def set_rng_state_all(states) -> None:
    for i, state in zip(_indices(), states):
        set_rng_state(state, i)


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
    mod.default_generators = tuple(default_generator(i) for i in _indices())
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
