"""`torch_tpu.profiler`: a device trace of what torch_tpu runs, for Perfetto or TensorBoard.

    with torch_tpu.profiler.trace("/tmp/prof") as t:
        loss = model(x).sum(); loss.backward(); opt.step()
    print(t.trace_file)  # <dir>/plugins/profile/<run>/<host>.trace.json.gz

It is XLA's profiler, through JAX (`jax.profiler.start_trace` / `stop_trace`): host
threads, XLA's launches and, on a TPU, every device op with its time. Every program is
named by what it runs, so the trace reads in torch's terms:
  - a Strict op's executable is `aten.mm.default` (`PjitFunction(aten.mm.default)` on the
    host; module `jit_aten.mm.default` on the device);
  - a DeferAndFuse graph is a span `DeferAndFuse fused_<n>ops_<digest>` whose arguments
    list its aten ops (`ops`), around the program of the same name; inside the program
    each op's XLA ops carry the aten op's name (their metadata: a TPU profile shows it);
  - a torch.compile graph is a span `torch.compile forward0` (backward1, ...).
`annotate(name)` adds a span of your own, `step(n)` marks a training step (TensorBoard's
step view). The block flushes pending DeferAndFuse work on entry, and on exit waits for
the device, so the trace holds the block's work and only that.

Open the trace: drop `t.trace_file` (or `t.perfetto_file`, with `perfetto=True`) on
https://ui.perfetto.dev, or `tensorboard --logdir <dir>` with the profile plugin.
`read_trace(path)` returns the events of a `.trace.json.gz`, a gzipped Chrome trace that
needs no TensorBoard to read.

`torch.profiler.profile()` keeps working on tpu code: it records the dispatch side (each
aten op torch dispatches, with its CPU time; the DeferAndFuse and compiled-graph spans
above appear in it too as `record_function` ranges), not device time.
"""
from __future__ import annotations

import gzip
import json
import pathlib

import jax

from . import _program_cache
from ._device import synchronize
from .op.current import flush_pending

annotate = _program_cache.annotate


def step(step_num: int, name: str = "train"):
    """A span marking training step `step_num` (TensorBoard groups the trace by it)."""
    return jax.profiler.StepTraceAnnotation(name, step_num=step_num)


class trace:  # (lower case: a context manager, named like jax.profiler.trace)
    """Record a device trace of the block into `log_dir` (see the module doc)."""

    def __init__(self, log_dir, *, perfetto: bool = False):
        self.log_dir = pathlib.Path(log_dir)
        self.perfetto = perfetto
        self.files: list[pathlib.Path] = []
        self._before: set = set()

    def __enter__(self):
        self._before = set(self.log_dir.rglob("*"))
        start_trace(self.log_dir, perfetto=self.perfetto)
        return self

    def __exit__(self, *exc):
        stop_trace()
        self.files = sorted(p for p in self.log_dir.rglob("*")
                            if p.is_file() and p not in self._before)
        return False

    def _find(self, suffix):
        found = [p for p in self.files if p.name.endswith(suffix)]
        return found[-1] if found else None

    @property
    def trace_file(self) -> pathlib.Path | None:
        """The Chrome-format trace (`*.trace.json.gz`) of the block."""
        return self._find(".trace.json.gz") if not self.perfetto else (
            self._find(".trace.json.gz") or self._find("perfetto_trace.json.gz"))

    @property
    def perfetto_file(self) -> pathlib.Path | None:
        """With perfetto=True: the trace for ui.perfetto.dev."""
        return self._find("perfetto_trace.json.gz")

    @property
    def xplane_file(self) -> pathlib.Path | None:
        """XLA's own format (`*.xplane.pb`), which TensorBoard's profile plugin reads."""
        return self._find(".xplane.pb")


def start_trace(log_dir, *, perfetto: bool = False) -> None:
    """Start recording a device trace into `log_dir` (`stop_trace` ends it)."""
    flush_pending("profiler")  # work recorded before the trace runs before it
    jax.profiler.start_trace(str(log_dir), create_perfetto_trace=perfetto)
    _program_cache.PROFILING[0] = True


def stop_trace() -> None:
    """Wait for the device, then end the trace and write its files."""
    try:
        synchronize()
    finally:
        _program_cache.PROFILING[0] = False
        jax.profiler.stop_trace()


def read_trace(path) -> list[dict]:
    """The events of a Chrome-format trace file (`.trace.json.gz` or `.json`)."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)]


__all__ = ["annotate", "read_trace", "start_trace", "step", "stop_trace", "trace"]
