"""Debug eager mode: Strict plus waiting for every op and checking it."""
from __future__ import annotations

from .strict import StrictExecutor


class DebugExecutor(StrictExecutor):
    name = "debug"
