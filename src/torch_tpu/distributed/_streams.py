"""Streams and events for `torch.tpu`, as device-agnostic distributed code expects them.

FSDP2 (and DDP's comm hooks) take `torch.<device>.Stream/Event/current_stream/stream` and
order their copy-in, all-gather and reduce-scatter streams with events. On tpu every
program is ordered by its data: a result buffer is an XLA future, and whatever reads it
waits for it. So one implicit stream is exact, and these are the no-ops torch.cpu has.
(Belongs in `_device.py`; installed from here only where `torch.tpu` lacks them.)
"""
from __future__ import annotations

import contextlib


class Stream:
    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = device
        self.priority = priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        import torch

        torch.tpu.synchronize()

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        import torch

        torch.tpu.synchronize()

    def elapsed_time(self, end) -> float:
        raise RuntimeError("tpu events do not record time")


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
    for name, value in _NAMES.items():
        if not hasattr(module, name):
            setattr(module, name, value)
