"""The current eager mode and its executor."""
from __future__ import annotations

from .strict import StrictExecutor

_STRICT = StrictExecutor()
_current = [_STRICT]


def executor():
    return _current[0]


def flush_pending() -> None:
    """Run whatever the current mode has deferred (nothing, in Strict)."""
    flush = getattr(_current[0], "flush", None)
    if flush is not None:
        flush()
