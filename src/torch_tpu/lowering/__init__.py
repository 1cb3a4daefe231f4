"""aten op -> JAX lowerings. Importing this package fills the one table.

Every family is listed here: none imports another to register it (foreach and optim import
the elementwise lowerings they build on, which they read at import time), and the dtype
rules they share live in _dtypes.py."""
from . import registry  # noqa: F401
from . import (  # noqa: F401
    activation, amp, attention, conv, creation, distance, fft, foreach, grouped_mm, indexing,
    linalg, loss, nn, optim, pointwise, random, reduction, resample, scaled_mm, shape, sorting,
    special,
)
from .registry import LOWERINGS, lowering, lookup  # noqa: F401
