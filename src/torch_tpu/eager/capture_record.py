"""Capture's recording (eager/capture.py has the whole story): every op of the region
becomes a node of one DeferAndFuse graph, each storage it touches noted with the buffer it
held before the region; what a captured region cannot hold raises CaptureError naming the
op and the user's line."""
from __future__ import annotations

import weakref

import jax
import torch

from .. import _C, _frames, _rng, _storage, metrics
from .._C import Lazy
from .._program_cache import op_entry
from ..op.opcall import scan_fast
from .defer import DeferExecutor

_ATTR = _storage.ATTR
# the flushes DeferAndFuse makes on its own (loops, size caps, step boundaries): a captured
# region is one graph, whatever its size
_OWN_FLUSHES = frozenset({"loop", "size_cap", "compile_guard", "backward", "optimizer_step",
                          "compiled_repeat"})
_SYNCS = {"item": "reads a value on the host (.item(), a Python bool or number of a tensor)",
          "to_cpu": "copies a tensor to the host",
          "print": "prints a tensor (reads it on the host)",
          "synchronize": "waits for the device (torch.tpu.synchronize)",
          "data_dependent": "makes a tensor whose shape depends on the data",
          "compiled_graph": "calls a torch.compile graph that reads or returns CPU tensors "
                            "for the first time (call it once before the capture: that "
                            "first call runs at once)",
          "collective": "runs a collective"}


class CaptureError(RuntimeError):
    """What a captured region cannot hold (the op and the user's line are in the message)."""


class Seed(int):
    """A random op's seed, told apart from every other scalar of the region (flush_plan
    passes each distinct object once): replay puts the generator's seed there."""


class Offset(int):
    """A random op's offset (see Seed): replay puts the generator's offset there."""




def where() -> str:
    return _frames.location(*_frames.user_line())


class Recorder(DeferExecutor):
    """DeferAndFuse's recording for one capture: every op becomes a node of one graph, on
    the Python path (C records for the DeferAndFuse executor only), noting each storage an
    op touches with the buffer it held before the region: replay reads the storages whose
    buffers the graph takes, and capture_end gives back what the region wrote."""

    name = "capture"
    __slots__ = ("before", "held")

    def __init__(self):
        super().__init__()
        # id(storage) -> (weakref to it, its buffer before the region): weak, since a
        # storage alive at capture_end is one the graph writes (an output), and the
        # region's intermediates must not be
        self.before = {}
        self.held = set()  # ids of those buffers (alive: `before` holds them)

    def execute(self, plan, vals):
        if _C.slot():
            raise CaptureError(
                f"{plan.name} on tpu:{_C.slot()} (at {where()}): a process with several "
                "devices captures on tpu:0 only; run the region there, or without capture")
        with self.lock:
            self._note(vals)
            key, bufs, dyns = scan_fast(plan, vals) or plan.scan(vals)
            entry = op_entry(plan, key, vals, False)
            if entry.fn is None:
                self.flush("data_dependent")
            if plan.seeded:
                self._check_generator(plan, vals)
                dyns[-2:] = [Seed(dyns[-2]), Offset(dyns[-1])]
            metrics.count("dispatches.capture")
            return _C.record(self._open_graph(), entry, bufs, dyns, vals)

    def _note(self, vals):
        for v in vals:
            if isinstance(v, (list, tuple)):
                self._note(v)
            elif isinstance(v, torch.Tensor) and v.device.type == "tpu":
                self._note_storage(v.untyped_storage())

    def _note_storage(self, st):
        seen = self.before.get(id(st))
        if seen is not None and seen[0]() is st:
            return
        rec = getattr(st, _ATTR, None)
        if rec is None or type(rec[0]) is Lazy:  # made in the region
            self.before[id(st)] = (weakref.ref(st), None)
            return
        buf = rec[0]
        if id(buf) in self.held:
            # two storages share one buffer (small constants are shared: two zero
            # biases): replay must read each from its own storage
            buf = jax.numpy.array(buf, copy=True)
            _storage.set_buffer(st, buf, rec[1], rec[2])
        self.before[id(st)] = (weakref.ref(st), buf)
        self.held.add(id(buf))

    def fill(self, storage, dtype, value) -> None:
        self._note_storage(storage)
        super().fill(storage, dtype, value)

    def abandon(self) -> None:
        """A region that raised: what it wrote holds what it held before it again."""
        nodes, self.nodes = self.nodes, []
        for ref, buf in self.before.values():
            st = ref()
            rec = getattr(st, _ATTR, None)
            if buf is not None and rec is not None and type(rec[0]) is Lazy:
                _storage.set_buffer(st, buf, rec[1], rec[2])
        for node in nodes:
            for lazy in node.outs:
                st = lazy.owner()
                if st is not None and getattr(st, _ATTR, (None,))[0] is lazy:
                    delattr(st, _ATTR)  # made in the region: zeros when next used
        _C.release(nodes)

    @staticmethod
    def _check_generator(plan, vals):
        for v in vals:
            if isinstance(v, torch.Generator) and v is not _rng.default_generator():
                raise CaptureError(
                    f"{plan} (called at {where()}) draws from a generator other than tpu's "
                    f"default one inside a captured region: capture advances the default "
                    f"generator only")

    def _after_record(self, entry):
        pass  # no loop detection: the region is one graph

    def flush(self, reason: str) -> None:
        if reason in _OWN_FLUSHES:
            return
        what = _SYNCS.get(reason, f"needs its results now ({reason})")
        raise CaptureError(
            f"torch.tpu.graph capture: the code at {where()} {what}; a captured region runs "
            f"as one device program, without the host. Move it out of the region.")

    def upload(self, storage, src) -> None:
        if src.numel() == 0:  # (HF's DynamicCache starts as torch.tensor([])): reads nothing
            return super().upload(storage, src)
        raise CaptureError(
            f"torch.tpu.graph capture: the code at {where()} reads a CPU tensor into the "
            f"region; a replay would not read it again. Copy it into a tpu tensor before the "
            f"capture and use that tensor inside it.")

    def graph(self, program, args):
        """A torch.compile graph's call: one node of the region (warmed up before it)."""
        self._note(args)
        out = super().graph(program, args)
        if program.n_seeded:  # its random ops draw anew at each replay, as the region's
            dyns = self.nodes[-1].dyns
            dyns[-2:] = [Seed(dyns[-2]), Offset(dyns[-1])]
        return out
