"""aten op -> JAX lowerings. Importing this package fills the one table."""
from . import registry  # noqa: F401
from . import pointwise, reduction, sorting, shape, indexing, linalg, nn, attention, loss, conv, resample, random, creation, fft  # noqa: F401,E401
from .registry import LOWERINGS, lowering, lookup  # noqa: F401
