"""Memory snapshots, as torch.cuda.memory has them: `torch.tpu.memory._record_memory_history`,
`_snapshot`, `_dump_snapshot`, and `torch.tpu.memory_summary()`.

While recording, the allocator (csrc/memory.cpp) hands every allocation, free and OOM of a
tpu storage to `_event` with its address and size; this module keeps the Python stack of
each live allocation and, with `enabled="all"`, a trace of the events (at most
`max_entries`, the oldest dropped). `_snapshot()` returns the dictionary torch's memory
visualiser reads (https://pytorch.org/memory_viz, `torch.cuda._memory_viz`):
  segments       one per live storage: the allocator gives each storage its own address
                 range and XLA its own buffer, so a segment holds exactly one block, in
                 state "active_allocated" (a DeferAndFuse result whose flush has not run
                 yet is reserved, and shown, already)
  device_traces  [[event, ...]] for the one device: "alloc", "free_completed" and "oom"
                 (with `device_free`), each with its address, size, time and frames
Frames are the Python stack at the event, innermost first ({"filename", "line", "name"}),
user code included; `stacks="all"` gives the same (there are no C++ allocator frames to
add). Only storages allocated while recording are in the snapshot, as on CUDA.
"""
from __future__ import annotations

import collections
import pickle
import sys
import time

import torch

from . import _C, _memory

_state = {"trace": None, "live": {}, "context": "all"}


def _frames():
    out, f = [], sys._getframe(2)  # (the caller of _event is the allocator's; skip both)
    while f is not None:
        out.append({"filename": f.f_code.co_filename, "line": f.f_lineno,
                    "name": f.f_code.co_name})
        f = f.f_back
    return out


def _event(action: str, addr: int, size: int) -> None:
    context, live = _state["context"], _state["live"]
    keep = context == "all" or (context in ("alloc", "state") and action == "alloc")
    frames = _frames() if keep else []
    if action == "alloc":
        live[addr] = (size, frames)
    elif action == "free_completed":
        live.pop(addr, None)
    trace = _state["trace"]
    if trace is not None:
        entry = {"action": action, "addr": addr, "size": size, "stream": 0,
                 "time_us": time.time_ns() // 1000, "frames": frames}
        if action == "oom":
            entry["device_free"] = _memory.mem_get_info()[0]
        trace.append(entry)


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                           device=None, clear_history=False, compile_context=False,
                           global_record_annotations=False) -> None:
    """Start (`enabled="all"`: live allocations and a trace of events; `"state"`: live
    allocations only) or stop (`enabled=None`) recording, as torch.cuda.memory's.
    `context`: which events keep their stack ("all", "alloc", "state" or None)."""
    if enabled is True:  # the legacy boolean form
        enabled = "all"
    if enabled not in (None, False, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all', got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if not enabled:
        _C.set_memory_recorder(None)
        return
    if clear_history or _state["trace"] is None or enabled == "state":
        _state["trace"] = collections.deque(maxlen=max_entries) if enabled == "all" else None
    _state["context"] = context
    _C.set_memory_recorder(_event)


def _snapshot(device=None) -> dict:
    """The live allocations and the trace, in torch.cuda.memory._snapshot()'s format."""
    segments = []
    for addr, (size, frames) in sorted(_state["live"].items()):
        block = {"address": addr, "size": size, "requested_size": size,
                 "state": "active_allocated", "frames": frames}
        segments.append({"device": 0, "address": addr, "total_size": size,
                         "allocated_size": size, "active_size": size, "requested_size": size,
                         "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": frames, "blocks": [block]})
    trace = list(_state["trace"] or ())
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_TPU_ALLOC_CONF": {}}}


def _dump_snapshot(filename="dump_snapshot.pickle") -> None:
    """Pickle `_snapshot()` to `filename`, for https://pytorch.org/memory_viz."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def memory_summary(device=None, abbreviated=False) -> str:
    """A table of the allocator's statistics, in torch.cuda.memory_summary()'s shape: each
    metric's current value, peak, and totals allocated and freed."""
    stats = _memory.memory_stats(device)

    def size(n):
        for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
            if abs(n) < 1024 or unit == "TiB":
                return f"{n:6.0f} {unit}" if unit == "B  " else f"{n:6.2f} {unit}"
            n /= 1024
        return ""

    rows = [("Allocated memory", "allocated_bytes", size), ("Active memory", "active_bytes", size),
            ("Requested memory", "requested_bytes", size), ("Reserved memory", "reserved_bytes", size),
            ("Allocations", "allocation", str), ("Active allocs", "active", str),
            ("Segments (storages)", "segment", str)]
    line = "=" * 75
    index = torch.tpu.current_device() if device is None else (
        device if isinstance(device, int) else torch.device(device).index or 0)
    out = [line, f" PyTorch tpu memory summary, device ID {index}", line,
           f"{'Metric':<22}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | "
           f"{'Tot Freed':>11}", "-" * 75]
    for title, key, fmt in rows:
        vals = [stats.get(f"{key}.all.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
        out.append(f"{title:<22}| " + " | ".join(f"{fmt(v):>11}" for v in vals))
    out += ["-" * 75, f"OOMs: {stats.get('num_ooms', 0)}    device allocations: "
            f"{stats.get('num_device_alloc', 0)}    device frees: "
            f"{stats.get('num_device_free', 0)}", line]
    return "\n".join(out) + "\n"

