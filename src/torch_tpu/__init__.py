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

set_cpu_fallback = _dispatch.set_cpu_fallback

__all__ = ["metrics", "set_cpu_fallback"]
