"""DeferAndFuse eager mode: ops are recorded and flushed as fused, cached XLA graphs."""
from __future__ import annotations

from .strict import StrictExecutor


class DeferExecutor(StrictExecutor):
    name = "defer_and_fuse"
