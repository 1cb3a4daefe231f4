"""torch_tpu: an XLA accelerator as a native PyTorch device named "tpu".

Importing this package registers the device: `torch.device("tpu")`, `torch.tpu`,
`Tensor.tpu()`, the lowerings of aten ops to JAX, and the eager executors.
"""


def _autoload():
    """Entry point for torch's device-backend autoload (`import torch` loads this package).

    Defined before anything imports torch: when `import torch_tpu` comes first, torch's
    own import resolves this entry point while the package is still half-imported."""


from . import _device  # noqa: E402

torch_tpu_module = _device.register()

from . import _dispatch  # noqa: E402
from . import metrics  # noqa: E402

_dispatch.register()

from .eager.modes import EagerMode, eager_mode, get_eager_mode, set_eager_mode  # noqa: E402
from .eager.debug import (  # noqa: E402
    TpuCpuMismatchError, TpuDebugError, TpuIndexError, TpuNonFiniteError)
from .op.asserts import DeviceAssertError  # noqa: E402  (CUDA's device-side assert)
from .eager import modes as _modes  # noqa: E402
from .eager import capture as _capture  # noqa: E402  (torch.tpu.graph, TPUGraph)

from .eager.graphed import make_graphed_callables  # noqa: E402

for _name in _capture.PUBLIC:
    setattr(torch_tpu_module, _name, getattr(_capture, _name))
torch_tpu_module.make_graphed_callables = make_graphed_callables
from . import _config  # noqa: E402

_modes.init_from_env()
if _config.get("TORCH_TPU_METRICS"):
    metrics.print_at_exit()

from . import _cache  # noqa: E402

_cache.setup()  # persistent XLA compilation cache (TORCH_TPU_CACHE_DIR)

from . import compile as _compile  # noqa: E402

_compile.register()  # torch.compile(backend="tpu")

from . import distributed  # noqa: E402,F401  (registers the "tpu_dist" c10d backend)
from . import _integrations  # noqa: E402

_integrations.install()  # HF accelerate learns the device when it is imported

set_cpu_fallback = _dispatch.set_cpu_fallback

from . import _precision, _program_cache, _program_stats, profiler  # noqa: E402
from ._program_cache import CacheMissError, set_cache_only  # noqa: E402
from ._recompiles import RecompileWarning  # noqa: E402

torch_tpu_module.precision = _precision.precision  # torch.tpu.precision("high"): one block
torch_tpu_module.compile_cache_stats = _program_stats.stats

from ._internal import pallas as _pallas  # noqa: E402,F401  (the reference's _internal.pallas.jax_op)
from ._kernels import jax_op  # noqa: E402  (custom kernels: a JAX or Pallas function as a torch op)
from ._buckets import pad_to_bucket, set_buckets  # noqa: E402  (the sizes that varying lengths compile at)
from . import export  # noqa: E402  (torch.export programs as StableHLO: export.to_jax)


def sync() -> None:
    """Run everything deferred so far and wait for it (same as torch.tpu.synchronize())."""
    torch_tpu_module.synchronize()


__all__ = ["DeviceAssertError", "EagerMode", "TpuCpuMismatchError", "TpuDebugError", "TpuIndexError",
           "TpuNonFiniteError", "eager_mode", "get_eager_mode", "jax_op", "metrics",
           "set_cpu_fallback", "set_eager_mode", "sync"]
__all__ += ["CacheMissError", "RecompileWarning", "export", "pad_to_bucket", "profiler", "set_buckets", "set_cache_only"]
