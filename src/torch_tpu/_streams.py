"""Streams and events of `torch.tpu`: what CUDA scripts time with, and what FSDP2 and
DDP's comm hooks order their streams with.

On tpu every program is ordered by its data: a result buffer is an XLA future, and
whatever reads it waits for it. So one implicit stream is exact: `Stream`, `stream()`,
`wait_stream` and `wait_event` order nothing because nothing needs ordering, and an
event without timing is a no-op marker, as on torch.cpu (so FSDP2's per-all-gather
events cost nothing and cut no DeferAndFuse graph).

A timing event (`Event(enable_timing=True)`) is real: `record()` waits until the work
dispatched before it has finished (deferred ops are flushed and run) and stamps the host
clock then. CUDA enqueues a marker that the GPU stamps when it reaches it; both stamps
mean "the device finished everything before this point", so `start.elapsed_time(end)`
is the device time between them in milliseconds, as CUDA's timing code expects. The
difference: recording waits on the host, so the host cannot run ahead of a timed region.
"""
from __future__ import annotations

import contextlib
import time

_synchronize = None  # torch.tpu.synchronize, given by install()


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._stamp = None  # time.perf_counter() when the work before record() was done

    def record(self, stream=None) -> None:
        if self.enable_timing:
            _synchronize()
            self._stamp = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True  # a timing event waited in record(); any other orders by data

    def synchronize(self) -> None:
        _synchronize()

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event's record() to `end`'s (both with timing)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._stamp is None or end._stamp is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end._stamp - self._stamp) * 1000.0


class Stream:
    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = device
        self.priority = priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _synchronize()

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


_DEFAULT = Stream()


def current_stream(device=None) -> Stream:
    return _DEFAULT


def default_stream(device=None) -> Stream:
    return _DEFAULT


@contextlib.contextmanager
def stream(s):
    yield s


def set_stream(s) -> None:
    pass


_NAMES = {"Stream": Stream, "Event": Event, "current_stream": current_stream,
          "default_stream": default_stream, "stream": stream, "set_stream": set_stream}


def install(module) -> None:
    """Put the names on `torch.tpu` (module); its `synchronize` is what events wait with."""
    global _synchronize
    _synchronize = module.synchronize
    for name, value in _NAMES.items():
        setattr(module, name, value)
