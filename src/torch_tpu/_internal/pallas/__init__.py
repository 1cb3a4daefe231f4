"""`torch_tpu._internal.pallas.jax_op`: the reference system's spelling of
`torch_tpu.jax_op` (torch_tpu/_kernels.py), the same function.

The reference module also holds `tpu_torch_pallas`, the runtime that inductor's Pallas code
generator for device type tpu calls. torch_tpu sends inductor's tpu graphs to its own
backend instead (docs/COMPILE.md), so that code generator never runs here and the module
does not exist."""
from ..._kernels import jax_op

__all__ = ["jax_op"]
