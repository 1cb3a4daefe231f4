"""PyTorch Lightning learns the tpu device: `Trainer` and `Fabric` train on it without torch_xla.

Lightning 2.6 knows "tpu" only as torch_xla: the name maps to its `XLAAccelerator`, whose
strategies and precision plugins import torch_xla (`Trainer(accelerator="tpu")` fails with
`ModuleNotFoundError: Requirement 'torch_xla>=1.13' not met`), and `accelerator="auto"`
looks at torch_xla, MPS and CUDA only, so with this package installed it trains on the CPU
without a word.

Lightning's public extension point does most of the work: `TPUAccelerator` (`_TPU` below) is
an `Accelerator` subclass, built once for Fabric's base class and once for the Trainer's, and
registered by its `register_accelerators` classmethod under the name "tpu" in each package's
registry (replacing the XLAAccelerator entry only where torch_xla is not installed). Like
Lightning's CPUAccelerator, `devices=N` means N processes; each drives its own device.

Three methods of each accelerator connector (Fabric's `_Connector` and the Trainer's
`_AcceleratorConnector`) decide from fixed lists of in-tree names, so they are wrapped. Each
runs Lightning's own code and changes the answer only for this accelerator:
  - `_choose_auto_accelerator`: "cpu", Lightning's last resort, becomes "tpu" when tpu is
    torch's current accelerator (torch_xla, MPS and CUDA still come first);
  - `_choose_strategy`: the original sends "tpu" to the XLA strategies, and any other
    accelerator instance on one device to `SingleDeviceStrategy("cpu")`; here one device
    gets `SingleDeviceStrategy(tpu:i)`, and several get "ddp" ("ddp_fork" in a notebook),
    Lightning's choice for CPU and CUDA. DDP's process group backend is then torch's
    default for the device, "tpu_dist";
  - `_check_and_init_precision`: for "bf16-mixed" and "16-mixed" the original builds
    `MixedPrecision(device="cuda")` for any accelerator but CPU and MPS: autocast on
    "cuda" without CUDA is disabled with a warning, so the run would be silently fp32.
    Here it is rebuilt for device_type "tpu" (and its GradScaler, for "16-mixed").
And one method of each package's `DDPStrategy`:
  - `determine_ddp_device_ids` (Fabric: `_determine_ddp_device_ids`): the original gives
    `[root_device.index]` for any device but the CPU, and with device ids `_setup_model`
    builds DDP inside `torch.cuda.stream(torch.cuda.Stream())`, which raises without CUDA.
    For a tpu root device it returns None: DDP over a one-device module is then the same
    DDP (it only stops moving inputs, which Lightning moves to the device itself).

Lightning ships in two layouts with separate code: the standalone `lightning_fabric` and
`pytorch_lightning`, and the unified `lightning` (`lightning.fabric`, `lightning.pytorch`).
Both are adapted, each when its connector module is first imported (`_on_import`), so
`import torch_tpu` imports nothing of Lightning. The wrappers are `_patches.Patch` objects
with the signatures of Lightning 2.6.6 (`WRITTEN_AGAINST`); on a mismatch that package is
left unpatched (with a warning: "tpu" is then torch_xla's again), and
tests/models/test_lightning.py fails.
"""
from __future__ import annotations

import importlib
import warnings

import torch

from .. import _on_import, _patches
from .._patches import Patch
from .accelerate import _tpu_is_the_accelerator

WRITTEN_AGAINST = "2.6.6"
DEVICE = "tpu"
# (Fabric's package, the Trainer's package) in the standalone and the unified layouts
LAYOUTS = (("lightning_fabric", "pytorch_lightning"), ("lightning.fabric", "lightning.pytorch"))
_FABRIC_CONNECTOR = "{pkg}.connector:_Connector"
_TRAINER_CONNECTOR = "{pkg}.trainer.connectors.accelerator_connector:_AcceleratorConnector"
ACCELERATORS: dict[str, type] = {}  # package -> its TPUAccelerator class


# ---------------------------------------------------------------- the accelerator
class _TPU:
    """The methods of TPUAccelerator, shared by the classes built on Fabric's and the
    Trainer's `Accelerator`."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != DEVICE:
            raise ValueError(f"TPUAccelerator: expected a {DEVICE} device, got {device}")
        torch.tpu.set_device(device)

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices) -> int:
        """The number of processes, one device each (as CPUAccelerator counts them): an
        int, or a string of one; -1 (like "auto") is torch.tpu.device_count(), which is
        torchrun's local world size, else 1."""
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if type(devices) is not int or devices == 0 or devices < -1:
            raise ValueError(f"`devices={devices!r}` with accelerator='{DEVICE}': give a number of "
                             "processes (each drives its own device), or -1 for all of this host's")
        return _TPU.auto_device_count() if devices == -1 else devices

    @staticmethod
    def get_parallel_devices(devices: int) -> list[torch.device]:
        # Each process reaches only its own device (docs/DEVICES.md). Under torchrun
        # (LOCAL_WORLD_SIZE known at start) local rank r's device is tpu:r, as with CUDA.
        # Lightning's own launcher starts ranks 1.. with LOCAL_RANK but not
        # LOCAL_WORLD_SIZE, and rank 0 is the user's script: there each process's device is
        # tpu:0, which names it in every process.
        by_rank = torch.tpu.device_count() >= devices
        return [torch.device(DEVICE, i if by_rank else 0) for i in range(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return torch.tpu.device_count()

    @staticmethod
    def is_available() -> bool:
        return _tpu_is_the_accelerator()

    @staticmethod
    def name() -> str:
        return DEVICE

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(DEVICE, cls, description=cls.__name__, override=True)

    def get_device_stats(self, device) -> dict:
        """The Trainer's DeviceStatsMonitor: torch.tpu's memory counters."""
        return dict(torch.tpu.memory_stats(device))

    def __reduce__(self):
        # strategy="ddp_spawn" pickles the Trainer; the class is built at run time
        return _accelerator, (self._package,)


def _accelerator(pkg: str):
    """A TPUAccelerator of `pkg`, in a process that may not have imported it yet."""
    module = next(m for m, p, *_ in _TARGETS if p == pkg)
    importlib.import_module(module)  # runs the adapter, which builds the class
    return ACCELERATORS[pkg]()


def _accelerator_class(base: type, pkg: str) -> type:
    doc = "The tpu device for Lightning, without torch_xla (torch_tpu/_integrations/lightning.py)."
    return type("TPUAccelerator", (_TPU, base),
                {"__module__": __name__, "__doc__": doc, "_package": pkg})


def _register(pkg: str, registry_name: str) -> None:
    """TPUAccelerator into `pkg`'s registry as "tpu", unless torch_xla serves that name."""
    accelerators = importlib.import_module(f"{pkg}.accelerators")
    if accelerators.XLAAccelerator.is_available():
        return
    cls = ACCELERATORS.get(pkg) or _accelerator_class(accelerators.Accelerator, pkg)
    ACCELERATORS[pkg] = cls
    cls.register_accelerators(getattr(accelerators, registry_name))


# ---------------------------------------------------------------- the connectors' wrappers
def _choose_auto_accelerator(original):
    def _choose_auto_accelerator() -> str:
        chosen = original()
        return DEVICE if chosen == "cpu" and _tpu_is_the_accelerator() else chosen
    return _choose_auto_accelerator


def _choose_strategy(original):
    names = original.__globals__  # the connector module's: its SingleDeviceStrategy, ...

    def _choose_strategy(self):
        if not isinstance(self.accelerator, _TPU):
            return original(self)
        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return "ddp_fork" if names["_IS_INTERACTIVE"] else "ddp"
        return names["SingleDeviceStrategy"](device=self._parallel_devices[0])
    return _choose_strategy


def _check_and_init_precision(original):
    mixed = original.__globals__["MixedPrecision"]

    def _check_and_init_precision(self):
        if not isinstance(self.accelerator, _TPU):
            return original(self)
        with warnings.catch_warnings():  # about the CUDA GradScaler replaced below
            warnings.filterwarnings("ignore", "torch.cuda.amp.GradScaler is enabled, but CUDA")
            precision = original(self)
        if type(precision) is mixed and precision.device == "cuda":
            precision = mixed(precision.precision, DEVICE)
        return precision
    return _check_and_init_precision


def _determine_ddp_device_ids(original):
    def determine_ddp_device_ids(self):
        return None if self.root_device.type == DEVICE else original(self)
    return determine_ddp_device_ids


def _package_patches(target: str, pkg: str, ddp_method: str) -> list[Patch]:
    """The wrappers of one connector class (`target`) and DDPStrategy of package `pkg`."""
    return [
        Patch(f"{pkg}.strategies.ddp:DDPStrategy.{ddp_method}", "(self) -> Optional[list[int]]",
              _determine_ddp_device_ids, "device ids make DDP's setup enter torch.cuda.stream"),
        Patch(f"{target}._choose_auto_accelerator", "() -> str", _choose_auto_accelerator,
              "accelerator='auto': Lightning's fallback after torch_xla, MPS and CUDA is the CPU"),
        Patch(f"{target}._choose_strategy",
              f"(self) -> Union[{pkg}.strategies.strategy.Strategy, str]", _choose_strategy,
              "'tpu' means the XLA strategies, another accelerator on one device the CPU"),
        Patch(f"{target}._check_and_init_precision",
              f"(self) -> {pkg}.plugins.precision.precision.Precision",
              _check_and_init_precision,
              "mixed precision autocasts on 'cuda' for any accelerator but CPU and MPS"),
    ]


# (module whose first import triggers the adapter, package, its registry, connector class,
#  DDPStrategy's method that names the device ids)
_TARGETS = [entry for fabric, trainer in LAYOUTS for entry in (
    (fabric + ".connector", fabric, "ACCELERATOR_REGISTRY", _FABRIC_CONNECTOR.format(pkg=fabric),
     "_determine_ddp_device_ids"),
    (_TRAINER_CONNECTOR.format(pkg=trainer).partition(":")[0], trainer, "AcceleratorRegistry",
     _TRAINER_CONNECTOR.format(pkg=trainer), "determine_ddp_device_ids"))]
PATCHES = {module: _package_patches(target, pkg, ddp) for module, pkg, _, target, ddp in _TARGETS}


def _adapter(module: str, pkg: str, registry_name: str):
    def adapt() -> None:
        if _patches.apply_all(PATCHES[module], f"{pkg} (written against {WRITTEN_AGAINST}) is "
                              "left unpatched: accelerator='tpu' and 'auto' will not use this "
                              "package's tpu device"):
            _register(pkg, registry_name)
    adapt.__qualname__ = f"lightning adapter for {pkg}"
    return adapt


def install() -> None:
    """Adapt each Lightning package now if it is loaded, else as soon as it is."""
    for module, pkg, registry_name, target, _ in _TARGETS:
        _on_import.when_imported(module, _adapter(module, pkg, registry_name),
                                 lambda m, name=target.rpartition(":")[2]: hasattr(m, name))
