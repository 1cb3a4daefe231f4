"""HF accelerate learns the tpu device, so that `transformers.Trainer` trains on it unmodified.

accelerate 1.15 does not ask `torch.accelerator`. It picks its device from a fixed chain of
in-tree checks (`PartialState.default_device`: mps, mlu, sdaa, musa, npu, hpu, cuda, xpu,
neuron, else cpu) and its distributed backend from another (`PartialState._prepare_backend`).
Inside Trainer, which already knows tpu and puts the model on tpu:0, accelerate's
`prepare()` then moves the model back to the CPU, and the first step fails with
`DeviceMismatchError ... tpu:0 and cpu (aten::embedding)`.

Its one extension point for a device it does not know is the ACCELERATE_TORCH_DEVICE
environment variable. Setting it by default at `import torch_tpu` was considered and
rejected:
  - it pins the device before anything else is looked at: `PartialState(cpu=True)`, i.e.
    `TrainingArguments(use_cpu=True)` or `accelerate launch --cpu`, would still train on
    tpu (`set_device` returns at once when a device is already set);
  - under torchrun it changes the device only: `_prepare_backend` still finds no backend,
    so every process trains alone (DistributedType.NO: no DDP, no gradient all-reduce);
  - it is inherited by child processes, including those that do not load this package
    (TORCH_DEVICE_BACKEND_AUTOLOAD=0), where `torch.device("tpu")` then raises.

So three methods of `PartialState` are wrapped. Each runs accelerate's own code first and
adds tpu only where accelerate found nothing, so a device accelerate knows (or a future
accelerate that knows tpu) is never overridden, and an explicit ACCELERATE_TORCH_DEVICE
still wins:
  - `default_device`: the CPU fallback becomes tpu when tpu is torch's current accelerator;
  - `_prepare_backend`: launched by torchrun (LOCAL_RANK set, the test accelerate itself
    uses), without cpu, and no in-tree backend matched: backend "tpu_dist" (or the one
    asked for) and DistributedType.MULTI_GPU, accelerate's generic one-process-per-device
    type (DDP wrapping, the FSDP upgrade, wait_for_everyone, broadcasts over the device);
  - `set_device`: for that type the original looks up `torch.cuda`, which would fail
    here; this sets tpu:{local_process_index % device_count()} and `torch.tpu.set_device`,
    as accelerate's generic branch does for its other devices.

The wrappers are installed when `accelerate.state` is first executed (`_on_import`, a finder on
`sys.meta_path`), so `import torch_tpu` imports nothing of accelerate. They are `_patches.Patch`
objects, like the patches of torch internals, each with the signature of what it wraps in
accelerate 1.15.0 (`WRITTEN_AGAINST`); on a mismatch nothing is patched (with a warning), and
tests/models/test_integrations.py fails.
"""
from __future__ import annotations

import inspect

import torch

from .. import _C, _on_import, _patches
from .._patches import Patch

WRITTEN_AGAINST = "1.15.0"
DEVICE = "tpu"
BACKEND = "tpu_dist"
_MODULE = "accelerate.state"
_MODELING = "accelerate.utils.modeling"


def _tpu_is_the_accelerator() -> bool:
    acc = torch.accelerator.current_accelerator(check_available=True)
    return acc is not None and acc.type == DEVICE


class _Property(property):
    """A property that can carry `_tpu_patch` (a plain property has no attribute dict)."""


class PropertyPatch(Patch):
    """A patch of a property: the signature checked is its getter's."""

    def current_signature(self):
        owner, name = self.owner_and_name()
        prop = inspect.getattr_static(owner, name)
        prop = self.original if getattr(prop, "_tpu_patch", None) is self else prop
        return str(inspect.signature(prop.fget))


def _default_device(original):
    def default_device(self) -> torch.device:
        device = original.fget(self)
        if device.type == "cpu" and _tpu_is_the_accelerator():
            return torch.device(DEVICE)
        return device
    return _Property(default_device, doc=original.__doc__)


def _prepare_backend(original):
    from accelerate.utils import DistributedType
    from accelerate.utils.environment import get_int_from_env

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        found, distributed_type = original(self, cpu, sagemaker_dp, backend)
        if (distributed_type == DistributedType.NO and not cpu and not sagemaker_dp
                and get_int_from_env(["LOCAL_RANK"], -1) != -1 and _tpu_is_the_accelerator()):
            return backend or BACKEND, DistributedType.MULTI_GPU
        return found, distributed_type
    return _prepare_backend


def _set_device(original):
    from accelerate.utils import DistributedType

    def set_device(self):
        # Only where the original would look up torch.cuda with no CUDA device to find.
        if (self.device is None and self.distributed_type == DistributedType.MULTI_GPU
                and not torch.cuda.is_available() and _tpu_is_the_accelerator()):
            module = getattr(torch, DEVICE)
            self.device = torch.device(DEVICE, self.local_process_index % module.device_count())
            module.set_device(self.device)
            return
        original(self)
    return set_device


def _reachable() -> list:
    """The tpu indices this process can place a model on: every device of a process that
    has several, else its own (docs/DEVICES.md)."""
    count = torch.tpu.device_count()
    return list(range(count)) if _C.multi() else [torch.tpu.current_device()]


def _max_memory(original):
    convert_file_size_to_int = original.__globals__["convert_file_size_to_int"]  # (its module's)

    def get_max_memory(max_memory=None):
        if not _tpu_is_the_accelerator() or torch.cuda.is_available():
            return original(max_memory)
        own = _reachable()
        if max_memory is None:  # what each device has free, before the CPU's budget
            free = {i: torch.tpu.mem_get_info(i)[0] for i in own}
            return {**free, **original(None)}
        ints = {k: v for k, v in max_memory.items() if isinstance(k, int)}
        if any(k not in own for k in ints):
            raise ValueError(f"max_memory names tpu devices {sorted(ints)}; this process can "
                             f"place weights on tpu:{', tpu:'.join(map(str, own))}")
        rest = original({k: v for k, v in max_memory.items() if not isinstance(k, int)})
        for k, v in ints.items():  # in place, as the original converts (transformers reads it)
            max_memory[k] = convert_file_size_to_int(v) if isinstance(v, str) else v
        max_memory.update(rest)
        return {**{k: max_memory[k] for k in sorted(ints)}, **rest}
    return get_max_memory


PATCHES = [
    PropertyPatch(
        f"{_MODULE}:PartialState.default_device", "(self) -> 'torch.device'", _default_device,
        "one process: accelerate's fallback after its in-tree devices is the CPU"),
    Patch(
        f"{_MODULE}:PartialState._prepare_backend",
        "(self, cpu: 'bool' = False, sagemaker_dp=False, backend: 'str | None' = None) "
        "-> 'tuple[str, DistributedType]'", _prepare_backend,
        "under torchrun: no in-tree backend matches, so every process would train alone"),
    Patch(
        f"{_MODULE}:PartialState.set_device", "(self)", _set_device,
        "under torchrun: MULTI_GPU's device would be looked up in torch.cuda"),
    # (patched before accelerate.utils and transformers copy the name: see install)
    Patch(
        f"{_MODELING}:get_max_memory",
        "(max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None)", _max_memory,
        "device_map='auto': the device memory is asked of torch.cuda and named devices "
        "only, so a model is placed on the CPU"),
]


def _patch() -> None:
    _patches.apply_all(PATCHES[:-1], f"accelerate (written against {WRITTEN_AGAINST}) is left "
                       "unpatched and may not use the tpu device (ACCELERATE_TORCH_DEVICE=tpu "
                       "sets it for a single process)")


def install() -> None:
    """Patch accelerate now if it is loaded, else as soon as it is: get_max_memory right
    after its module runs, before `accelerate.utils` and transformers import the name."""
    _on_import.when_imported(_MODELING, _patch_memory, lambda m: hasattr(m, "get_max_memory"))
    _on_import.when_imported(_MODULE, _patch, lambda m: hasattr(m, "PartialState"))


def _patch_memory() -> None:
    _patches.apply_all(PATCHES[-1:], f"accelerate (written against {WRITTEN_AGAINST}): "
                       "device_map='auto' places models on the CPU")
