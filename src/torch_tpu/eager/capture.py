"""Capture and replay: `torch.tpu.graph`, `torch.tpu.TPUGraph` and `torch.accelerator.Graph`.

A CUDA graph records a region's kernels once and replays them with one launch. On an XLA
device the natural form of that is one program: the region's ops are recorded as
DeferAndFuse records them (a pending graph of nodes, csrc/graph.cpp), and `capture_end`
makes the whole graph one XLA program, compiled once and held by the graph object (not by
the program LRU, which could evict it). `replay` runs it on the buffers the captured
tensors' storages hold at that moment and gives the results back to the storages it
wrote: parameters and optimizer state updated in place, the static outputs refilled.
Replay compiles nothing, reads nothing back, and makes one XLA call.

As in CUDA:
  - capture runs nothing: after `capture_end` the tensors the region wrote hold what they
    held before it (parameters, optimizer state) or zeros (tensors it made), until a
    replay. Warm up before capturing, as with CUDA graphs, so that lazily made state
    (optimizer moments) exists outside the region.
  - inputs are the captured tensors themselves: copy new data into them (`copy_`) before
    a replay. Python numbers an op took (a learning rate) are fixed at capture.
  - random ops draw anew at every replay: the default generator's offset advances by what
    the region drew (`capture_end` gives back what capture drew), and a replay's draws
    follow the generator's seed at that moment.
  - an optimizer steps in a captured region as on CUDA: those whose step torch checks
    (the ones with a step count: Adam, AdamW, NAdam, RAdam, Adamax, ASGD, Adadelta,
    RMSprop, Rprop, Adafactor) only with `capturable=True`; SGD and Adagrad, which torch
    does not check, as they are. torch's check looks at CUDA and XPU streams only; a step
    pre-hook asks tpu's capture the same of the same optimizers.

What capture cannot hold raises CaptureError naming the op and the user's line: a host
sync (`.item()`, `.cpu()`, printing a tensor), an op whose result's shape depends on the
data (`nonzero`), a CPU tensor read into the region, the first call of a compiled graph
that reads or returns CPU tensors (any other torch.compile graph is one node of the
region, from its first call), a random op on a generator other than the default one, and
an eager-mode switch. A replay refuses a captured storage whose size changed.

Not kept from the eager modes: device-side asserts (an out-of-range index inside a
captured region is clamped, not reported), and buffer donation (a replay holds the old and
new values of what it updates until it returns: twice the parameters' and optimizer
state's memory at that moment).
"""
from __future__ import annotations

import contextlib
import gc
import inspect

import jax
import torch

from .. import _C, _on_import, _program_cache, _rng, _runtime, _storage, metrics
from .._program_cache import PROFILING
from ..op import current
from . import fuse
from .capture_record import CaptureError, Offset, Recorder, Seed, where
from .modes import EagerMode

_ATTR = _storage.ATTR
_CAPTURING: list = []  # the graphs capturing now (one per thread at most)
# graph key (fuse's: op entries, wiring, outputs, scalar slots) -> (call, compiled, entries):
# a region captured again as it was reuses its program. Held under the one program
# cache's bound (_program_cache.admit_captured).
_PROGRAMS: dict = {}


class TPUGraph:
    """torch.cuda.CUDAGraph's interface on tpu (see the module doc)."""

    def __init__(self, keep_graph: bool = False):
        self.keep_graph = keep_graph
        self._reset()

    def _reset(self):
        self._recorder = None
        self._token = None
        self._example = None    # capture_end: the buffers read at capture, until compiled
        self._key = None        # capture_end: (graph key, the entries it names by id)
        self._compiled = None   # instantiate: its call (a direct PJRT call where it can)
        self._body = None       # capture_end: (body builder, argument avals); None: empty
        self._repeated = None   # replay_steps: the program running the region n times
        self._stages = None
        self._inputs = ()       # the storages read (or constants), in argument order
        self._sizes = ()        # their sizes in bytes at capture
        self._outputs = ()      # the storages written, in the program's result order
        self._dyns = ()         # the region's scalars
        self._rng = ()          # (index in _dyns, seed?, offset from the capture's first)
        self._draws = 0         # offsets the region advances the generator by
        self._base = 0
        self._captured = False

    # ------------------------------------------------------------ capture
    def capture_begin(self, pool=None, capture_error_mode: str = "default") -> None:
        if self._recorder is not None or self._captured:
            raise CaptureError("TPUGraph.capture_begin: this graph already holds a capture; "
                               "call reset() first")
        if _CAPTURING:
            raise CaptureError("TPUGraph.capture_begin: another capture is open")
        current.flush_pending("capture")  # work from before the region runs as it was
        self._recorder = Recorder()
        self._base = _rng.default_generator().get_offset()
        self._token = current.enter(EagerMode.DEFER_AND_FUSE, self._recorder, True)
        _CAPTURING.append(self)

    def capture_end(self) -> None:
        if self._recorder is None:
            raise CaptureError("TPUGraph.capture_end without capture_begin")
        rec = self._close()
        nodes, rec.nodes = rec.nodes, []
        self._captured = True
        if not nodes:
            return
        try:
            self._plan(nodes, rec.before)
        finally:
            _C.release(nodes)
        metrics.count("graphs.captured")
        if not self.keep_graph:
            self.instantiate()

    def _plan(self, nodes, before):
        key, ext, dyns, storages, _ = _C.flush_plan(nodes, False)
        # (a storage that died before the end is no input: its buffer is fixed, a constant)
        owner = {id(b): ref() for ref, b in before.values() if b is not None and ref() is not None}
        # each input: the storage replay reads, or a compiled graph's constant (its own)
        inputs = [owner.get(id(b), b) for b in ext]
        wiring, out_refs, dyn_slots, _, _ = fuse._decode(key)
        # what the body needs of each node (not the node: it holds the buffers read at
        # capture, which the graph must not keep alive)
        shells = [_Shell(n.entry, n.dyns) for n in nodes]
        n_ext = len(ext)

        def body():  # built on a program-cache miss only (generate captures per call)
            fn = fuse._build(shells, wiring, out_refs, dyn_slots, n_ext)
            fn.__name__ = fn.__qualname__ = f"captured_{len(shells)}ops"
            return fn

        self._rng = tuple((j, type(d) is Seed, int(d) - self._base)
                          for j, d in enumerate(dyns) if type(d) in (Seed, Offset))
        # seeds and offsets as device scalars too, so that every argument is an array and
        # replay takes the direct call (_runtime.direct_call)
        self._dyns = tuple(_runtime.scalar_to_device(int(d)) if type(d) in (Seed, Offset)
                           else d for d in dyns)
        self._inputs, self._outputs = tuple(inputs), tuple(storages)
        self._sizes = tuple(x.nbytes() if isinstance(x, torch.UntypedStorage) else None
                            for x in inputs)
        self._example = [*ext, *self._dyns]  # (for the direct call: jit made on a miss only)
        self._body = (body, [_aval(a) for a in self._example])
        self._key = (key, [n.entry for n in nodes])
        # capture runs nothing: what the region wrote holds what it held before it (what
        # it made: zeros)
        for st in storages:
            _, n, jdt = getattr(st, _ATTR)
            ref, buf = before.get(id(st), (None, None))
            buf = buf if ref is not None and ref() is st else None
            _storage.set_buffer(st, _storage.zeros(n, jdt) if buf is None else buf, n, jdt)

    def instantiate(self) -> None:
        """Compile the captured program (capture_end does, unless keep_graph)."""
        if not self._captured:
            raise CaptureError("TPUGraph.instantiate: nothing was captured")
        if self._compiled is not None or self._body is None:
            return  # compiled already, or an empty region
        body, avals = self._body
        # the buffers read at capture make the direct call; once dropped, the avals
        args, self._example = self._example or avals, None
        key, entries = self._key

        def make():
            jitted = jax.jit(body())
            compiled = jitted.lower(*args).compile()
            # the direct call: ~0.1 ms less per replay of a 31-input decode step (0.32 ->
            # ~0.2 ms)
            direct = _runtime.direct_call(jitted, args, PROFILING)
            return compiled if direct is jitted else direct, compiled, entries

        self._compiled, self._stages, _ = _program(key, make, f"captured_{len(entries)}ops")

    # ------------------------------------------------------------ replay
    def replay(self) -> None:
        if self._launchable():
            if self._compiled is None:
                self.instantiate()
            args, dyns = self._launch_args(1)
            results = self._compiled(*args, *dyns)
            _C.replace_buffers(list(self._outputs), None, results)
            metrics.count("graphs.replays")

    def replay_steps(self, n: int) -> None:
        """`n` replays in one launch: one program runs the region n times in a device loop,
        each run reading what the last one wrote, as n replays in a row would (random ops
        draw anew in each). For a region whose writes feed its own next run, such as
        generate()'s decode step (a token a run): the host launches once per n."""
        if n < 1 or not self._launchable():
            return
        if self._repeated is None:
            self._repeated = _repeated_program(self)
            self._example = None  # (a later replay() compiles from the avals)
        args, dyns = self._launch_args(n)
        results = self._repeated(*args, *dyns, _runtime.scalar_to_device(n))
        _C.replace_buffers(list(self._outputs), None, results)
        metrics.count("graphs.replays", n)

    def _launchable(self) -> bool:
        """Whether there is something to replay (False: an empty region)."""
        if not self._captured:
            raise CaptureError("TPUGraph.replay: nothing was captured")
        return self._body is not None

    def _launch_args(self, runs: int):
        """(input buffers, scalars) of the next `runs` replays; the generator moves past
        their draws."""
        current.flush_pending("graph_replay")  # pending writes to the inputs land first
        args = []
        for x, n in zip(self._inputs, self._sizes):
            if n is None:
                args.append(x)
                continue
            if x.nbytes() != n:
                raise CaptureError(f"TPUGraph.replay: a captured tensor's storage was resized "
                                   f"({n} -> {x.nbytes()} bytes) since the capture")
            args.append(getattr(x, _ATTR)[0])
        dyns = list(self._dyns)
        if self._rng:
            gen = _rng.default_generator()
            seed = gen.initial_seed() & _rng.SEED_MASK
            now = gen.get_offset()
            for j, is_seed, rel in self._rng:
                dyns[j] = _runtime.scalar_to_device(seed if is_seed else (now + rel) & _rng.SEED_MASK)
            gen.set_offset(now + runs * self._draws)
        return args, dyns

    def _close(self):
        """Leave the capture (ended or failed) -> its recorder; the generator goes back to
        where capture found it, having counted the region's draws."""
        rec, self._recorder = self._recorder, None
        _CAPTURING.remove(self)
        current.leave(self._token)
        self._token = None  # (it holds the recorder, and so the buffers read at capture)
        gen = _rng.default_generator()
        self._draws = gen.get_offset() - self._base
        gen.set_offset(self._base)  # capture draws nothing: each replay does
        if rec.paused_gc:
            gc.enable()
        return rec

    def _abandon(self) -> None:
        self._close().abandon()
        self._reset()

    def reset(self) -> None:
        if self._recorder is not None:
            raise CaptureError("TPUGraph.reset during a capture")
        self._reset()

    def pool(self) -> tuple:
        """An opaque pool id (XLA allocates every buffer itself: pools mean nothing here)."""
        return (0, id(self))

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path: str) -> None:
        text = (self._stages.as_text() if self._stages is not None else
                jax.jit(self._body[0]()).lower(*self._body[1]).as_text() if self._body else "")
        with open(path, "w") as f:
            f.write(text)


class _Shell:
    """What fuse._build reads of a node: its entry and its scalars."""

    __slots__ = ("entry", "dyns")

    def __init__(self, entry, dyns):
        self.entry, self.dyns = entry, dyns


def _aval(x):
    """An argument's abstract value for lowering (no buffer kept alive); Python numbers as
    they are (jit types them weakly, as at the call)."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
    return x


def _repeated_program(g: TPUGraph):
    """The captured region run n times by one program (n, a device scalar, its last
    argument): a fori_loop whose carry is the region's outputs. An output that is also an
    input (a storage the region reads and writes) feeds that input in the next run; the
    generator's offsets advance by the region's draws each run. Cached as the region's own
    program, by its graph key and which outputs feed which inputs (not in that key: a
    region writing what it reads and one writing elsewhere may share it)."""
    (body, avals), (key, entries) = g._body, g._key
    feeds = tuple(next((i for i, x in enumerate(g._inputs) if x is st), None) for st in g._outputs)
    draws = g._draws

    def make():
        n_ext = len(g._inputs)
        offsets = [j for j, is_seed, _ in g._rng if not is_seed]
        fn = body()
        # each output is its storage's flat buffer (known: no trace to learn the shapes)
        flat = [getattr(st, _ATTR)[1:] for st in g._outputs]

        def repeated(*args):
            ext, dyns, n = args[:n_ext], args[n_ext:-1], args[-1]

            def run(i, outs):
                e = list(ext)
                for out, i_in in zip(outs, feeds):
                    if i_in is not None:
                        e[i_in] = out
                d = list(dyns)
                for j in offsets:
                    d[j] = d[j] + (i * draws).astype(d[j].dtype)
                return tuple(fn(*e, *d))

            first = tuple(ext[i_in] if i_in is not None else jax.numpy.zeros((n_el,), jdt)
                          for (n_el, jdt), i_in in zip(flat, feeds))
            return list(jax.lax.fori_loop(0, n, run, first))

        n_aval = jax.ShapeDtypeStruct((), _runtime.scalar_to_device(1).dtype)
        # (with the entries, as the region's own program: the key names them by id)
        compiled = jax.jit(repeated).lower(*avals, n_aval).compile()
        return compiled, compiled, entries

    return _program((key, "repeated", feeds, draws), make, f"captured_{len(entries)}ops_repeated")[0]


def _program(key, make, name):
    """`_PROGRAMS[key]`, made by `make()` on a miss and admitted to the one program cache
    (its bound, cache-only mode, statistics)."""
    hit = _PROGRAMS.get(key)
    if hit is not None:
        _program_cache.touch(hit)
        metrics.count("graphs.cache_hits")
        return hit
    metrics.count("graphs.compiled")
    return _program_cache.admit_captured(_PROGRAMS, key, make, name, where())


def is_current_stream_capturing() -> bool:
    return bool(_CAPTURING)


def graph_pool_handle() -> tuple:
    return (0, 0)


class graph:  # noqa: N801  (torch.cuda.graph)
    """`with torch.tpu.graph(g):` captures the block into `g` (pool and stream are accepted
    for torch.cuda.graph's signature; they mean nothing on tpu)."""

    def __init__(self, tpu_graph: TPUGraph, pool=None, stream=None,
                 capture_error_mode: str = "global"):
        self.graph = tpu_graph

    def __enter__(self):
        torch.tpu.synchronize()
        self.region = capturing(self.graph)
        self.region.__enter__()

    def __exit__(self, *exc):
        return self.region.__exit__(*exc)


@contextlib.contextmanager
def capturing(g: TPUGraph):
    """The block captured into `g`, as `graph` does but without its device sync first (HF
    generate's decode step records while the prefill still runs)."""
    g.capture_begin()
    try:
        yield
    except BaseException:
        if g._recorder is not None:
            g._abandon()  # the region failed: the process stays usable
        raise
    g.capture_end()


_HEALTH_CHECK = "_accelerator_graph_capture_health_check"
_ASKS: dict = {}  # optimizer class -> whether its step() asks torch's capture check
_NO_CODE = (lambda: None).__code__


def _asks_capture_check(cls) -> bool:
    """Whether torch's step() of `cls` (or of a class it inherits step() from) calls torch's
    capture check: the optimizers with a step count do (Adam, AdamW, NAdam, RAdam, Adamax,
    ASGD, Adadelta, RMSprop, Rprop, Adafactor), SGD and Adagrad do not."""
    asks = _ASKS.get(cls)
    if asks is None:
        steps = (k.__dict__["step"] for k in cls.__mro__ if "step" in k.__dict__)
        asks = _ASKS[cls] = any(_HEALTH_CHECK in getattr(inspect.unwrap(s), "__code__",
                                                         _NO_CODE).co_names for s in steps)
    return asks


def _check_capturable(optimizer, args, kwargs):
    """torch's capture check, for tpu's capture: torch's asks CUDA and XPU streams only. A
    step pre-hook (a patch of the check itself would be a function dynamo cannot trace
    inside a compiled step), for the same optimizers."""
    if (_CAPTURING and _asks_capture_check(type(optimizer))
            and not all(g.get("capturable", False) for g in optimizer.param_groups)):
        raise CaptureError(
            f"Attempting torch.tpu.graph capture of step() for an instance of "
            f"{type(optimizer).__name__} but param_groups' capturable is False (at {where()}). "
            f"Construct it with capturable=True: its step count must live on the device.")


def _hook_optimizer_steps():
    import torch.optim.optimizer as optimizer

    optimizer.register_optimizer_step_pre_hook(_check_capturable)


# (torch.optim may still be loading when torch's device autoload imports torch_tpu)
_on_import.when_imported("torch.optim.optimizer", _hook_optimizer_steps,
                         lambda m: hasattr(m, "register_optimizer_step_pre_hook"))


# torch.accelerator.Graph() on tpu makes a TPUGraph (csrc/graphs.cpp forwards to it)
_C.set_graph_factory(lambda keep_graph: TPUGraph(keep_graph))

# (CUDAGraph too: a script whose "cuda" became "tpu" still says torch.tpu.CUDAGraph)
CUDAGraph = TPUGraph
PUBLIC = ("TPUGraph", "CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing")
# (and make_graphed_callables: eager/graphed.py, built on these)
