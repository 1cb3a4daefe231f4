"""Every XLA program torch_tpu keeps, in one bounded LRU, and the rules of every lookup.

Four caches hold programs, each keyed its own way: Strict's per-op entries (an OpPlan's
`cache`, a plain dict because csrc/kernel.cpp reads it), DeferAndFuse's fused graphs
(eager/fuse.py), captured regions (eager/capture.py) and compiled graphs' executables
(compile/program.py). Each admits what it compiles here, and this module applies, once
for all four:

  bound       one LRU over them all, by count (TORCH_TPU_PROGRAM_CACHE_MAX_PROGRAMS) and
              bytes (TORCH_TPU_PROGRAM_CACHE_MAX_MB): past either, the least recently used
              program leaves its cache (metrics `programs.<kind>.evictions`) and its
              executable is freed with it. A fused graph names its op entries by id, so it
              pins them: they leave after it. XLA:CPU reports no code size for an
              executable (0), yet each one held costs ~0.3 MB of resident memory (500
              distinct sizes of one op: tests/unit/test_program_cache.py), so 0.5 MiB is
              its size on CPU; elsewhere the size is XLA's generated-code size. That is
              once jax's cached lowering of it is dropped, after its first call
              (_jax_internals.forget_lowerings): with it, 1.5 MB.
  maps        and by the process's memory mappings, of which Linux allows a limited
              number: near the limit the program bound is lowered (_maps.py)
  precision   an op whose lowering is precision-sensitive (_precision.py) is looked up
              under (key, precision snapshot) and traced with the snapshot bound
  cache-only  `set_cache_only(True)` (serving after warm-up): a miss raises CacheMissError
              naming the op or graph, the user's line and what differed from the last
              program of the same op or graph
  reasons     each program is compiled with the reason it differs from the last one of
              its op, op sequence or graph, and a site that keeps compiling for new
              shapes warns (RecompileWarning): _recompiles.py
  first call  XLA compiles a program on its first call; that call is timed, told whether
              the persistent cache had it (_cache.py), and, with TORCH_TPU_DUMP_DIR set,
              writes the program's StableHLO with its key and reason. Programs are named
              for profiles by what they run (`jit_aten.mm.default`, `jit_fused_12ops_...`);
              names are stable across processes, as the persistent cache's keys need
  shipping    every executable obtained is recorded for torch.compiler's
              save_cache_artifacts (_cache.XlaArtifact, once per key): a process that
              loads them compiles nothing it was shipped (docs/SHIPPING_PROGRAMS.md)

`_program_stats.stats()` (torch.tpu.compile_cache_stats()) reports it all; `python -m
torch_tpu report` prints the last runs' stats, saved into the cache folder when each
process ends.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import os
import threading
import time
import warnings
import weakref

import jax
import torch

from . import (_C, _cache, _config, _frames, _jax_internals, _maps, _precision, _recompiles,
               _runtime, metrics)

OP, GRAPH, COMPILED = "op", "graph", "compiled"
DONATED = "donated"  # an op program's lookup beside its key: it donates its first buffer
KINDS = (OP, GRAPH, COMPILED)
CPU_PROGRAM_BYTES = 1 << 19   # 0.5 MiB: see the module doc
_MB = 1 << 20


class CacheMissError(RuntimeError):
    """A program was missing in cache-only mode (`torch_tpu.set_cache_only(True)`)."""


class Program:
    """One cached program: where it is held, what it cost, why it was compiled."""

    __slots__ = ("ahead", "aliases", "calls", "compiled", "disk", "donates", "fn", "ident", "key",
                 "kind", "label", "name", "nbytes", "owner", "pinned", "pins", "precision",
                 "reason", "seconds", "where", "__weakref__")  # (_AHEAD_PENDING)

    def __init__(self, kind, name, where, owner, key, reason, precision=None):
        self.kind, self.name, self.where = kind, name, where
        self.owner, self.key, self.reason = owner, key, reason
        self.precision = precision
        self.seconds = 0.0     # the first call's wall time: trace, lower, XLA compile, launch
        self.nbytes = 0
        self.disk = None       # whether the persistent cache had it (None: not compiled yet)
        self.calls = 0         # graph and compiled programs: calls after the first
        self.pins = ()         # the op programs a fused graph names by id
        self.pinned = 0        # how many cached graphs pin this op program
        self.compiled = False
        self.fn = None         # graph and compiled programs: the jitted function (op
        #                        programs and compiled ones after their first call: its
        #                        direct call, _runtime.direct_call)
        self.label = None      # their profiler annotation
        self.ident = None      # its key in the LRU: id() of what its cache holds
        self.ahead = None      # compiled programs: the future of compile_ahead's work
        self.donates = False   # an op program that donates its first buffer (op_entry)
        self.aliases = ()      # (table, key): other lookups of an op program (add_alias)

    def summary(self) -> dict:
        return {"kind": self.kind, "name": self.name, "where": self.where,
                "reason": self.reason, "compile_seconds": round(self.seconds, 6),
                "bytes": self.nbytes, "disk_hit": self.disk, "calls": self.calls}

    # graph and compiled programs are called through their record
    def __call__(self, *args):
        if not self.compiled:
            return _first_run(self, self.fn, args)
        self.calls += 1
        try:
            _move(self.ident)
        except KeyError:
            pass
        if PROFILING[0] or _torch_profiling():
            with annotate(self.label[0], **self.label[1]):
                return self.fn(*args)
        return self.fn(*args)


# ---------------------------------------------------------------- state
_LRU: collections.OrderedDict = collections.OrderedDict()  # id(value) -> Program
_move = _LRU.move_to_end
_lock = threading.RLock()
_held = {k: [0, 0] for k in KINDS}   # kind -> [programs, bytes]
_limits = {"programs": _config.get("TORCH_TPU_PROGRAM_CACHE_MAX_PROGRAMS"),
           "bytes": _config.get("TORCH_TPU_PROGRAM_CACHE_MAX_MB") * _MB}
_CACHE_ONLY = [False]
ADMITTED = [False]    # whether this process has held a program (_program_stats saves its run)
PROFILING = [False]   # profiler.py: a device trace is being recorded
_seq = itertools.count()
_COUNT = metrics.counters
_torch_profiling = torch._C._autograd._profiler_enabled


def set_limits(programs: int | None = None, mb: int | None = None) -> None:
    """Bound the program caches (defaults: the TORCH_TPU_PROGRAM_CACHE_* settings)."""
    if programs is not None:
        _limits["programs"] = programs
    if mb is not None:
        _limits["bytes"] = mb * _MB
    with _lock:
        _evict()


def limits() -> dict:
    return {"programs": _limits["programs"], "mb": _limits["bytes"] // _MB}


def set_cache_only(enabled: bool = True) -> bool:
    """`torch_tpu.set_cache_only(True)`: from now on a program that is not already
    compiled in this process raises CacheMissError instead of compiling (for serving
    after a warm-up; the persistent disk cache does not count, since loading from it
    still traces and costs milliseconds). Returns the previous setting."""
    old = _CACHE_ONLY[0]
    _CACHE_ONLY[0] = bool(enabled)
    return old


def is_cache_only() -> bool:
    return _CACHE_ONLY[0]


def annotate(name: str, **info):
    """A named span in the device trace (jax.profiler) and, while torch's profiler runs,
    in torch's trace too."""
    ann = jax.profiler.TraceAnnotation(name, **info)
    if not _torch_profiling():
        return ann
    stack = contextlib.ExitStack()
    stack.enter_context(torch.profiler.record_function(name))
    stack.enter_context(ann)
    return stack


# ---------------------------------------------------------------- the op caches
def op_entry(plan, key, vals, standalone, donate=False):
    """The entry of one op call: Strict's and DeferAndFuse's lookup in the op's cache
    (`standalone`: Strict runs the entry's own executable; DeferAndFuse fuses its body).
    `donate`: a program of its own that donates its first buffer to XLA (Strict's
    write_in_place), keyed apart from the op's."""
    prec = None
    if plan.precision is not None:  # a sensitive op (OpPlan.precision: C keys it the same)
        prec = plan.precision()
        lookup = (key, prec)
    else:
        lookup = key
    if donate:
        lookup = (lookup, DONATED)
    entry = plan.cache.get(lookup)
    if entry is not None:
        try:
            _move(id(entry))
        except KeyError:  # evicted while another thread held it
            pass
        return entry
    return _op_miss(plan, key, lookup, vals, prec, standalone, donate)


def _op_miss(plan, key, lookup, vals, prec, standalone, donate=False):
    metrics.count("cache_misses")
    name = str(plan)
    line = _frames.user_line()
    where = _frames.location(*line)
    reason, _ = _recompiles.why((OP, plan), key[1], prec, plan.names)
    if _CACHE_ONLY[0]:
        raise CacheMissError(f"torch_tpu cache-only mode: {name} (called at {where}) has no "
                             f"compiled program: {reason}")
    entry = plan.compile(key, vals)
    rec = Program(OP, name, where, plan.cache, lookup, reason, prec)
    rec.donates = donate
    if prec is not None:  # what DeferAndFuse's recompile reasons compare shows it too
        entry.key = (key[0], (*key[1], ("precision", *prec)), *key[2:])
    if entry.raw is not None:
        raw = _precision.binding(entry.raw, prec) if prec is not None else entry.raw
        raw.__name__ = raw.__qualname__ = name  # its XLA module and profiler name
        entry.raw = raw
    if entry.fn is not None:
        # a new jit of the named body (jit takes its name when it is made); its first
        # call compiles it and installs its direct call (_runtime.direct_call)
        jitted = jax.jit(entry.raw, donate_argnums=(0,) if donate else ())
        if donate:
            rec.fn = jitted  # (what its entry calls after the first: see _first_run)

        def first_call(*args):
            entry.ahead = None
            out = _first_run(rec, jitted, args)
            entry.fn = rec.fn  # its direct call (_first_run)
            return out

        entry.fn = first_call
        entry.ahead = lambda args: compile_ahead(rec, args, jitted)
        if standalone:
            metrics.count("executables_compiled")
    plan.cache[lookup] = entry
    # (DeferAndFuse: its graphs are the programs that storm.)
    if standalone and not _recompiles.layered():
        _recompiles.storm((OP, plan, where, _recompiles.subject(plan, vals)), name, line, key[1],
                          plan.names)
    _admit(rec, id(entry))
    return entry


# ---------------------------------------------------------------- fused graphs
def graph_name(nodes) -> str:
    """A fused graph's program name: its op count and a digest of its op sequence (the
    same in every process, as the persistent cache's keys need)."""
    ops = "\n".join(str(n.entry.key[0]) for n in nodes)
    return f"fused_{len(nodes)}ops_{hashlib.blake2b(ops.encode(), digest_size=4).hexdigest()}"


def admit_graph(cache, key, nodes, body, donate, reason) -> Program:
    """A fused graph's program, stored by the caller as `cache[key]`'s first item: a
    callable that compiles on its first call and pins the graph's op entries."""
    name = graph_name(nodes)
    line = nodes[-1].frame
    where = _frames.location(*line) if line else "?"
    ops = tuple(n.entry.key[0] for n in nodes)
    parts = tuple(n.entry.key[1] for n in nodes)
    labels = [_node_label(i, n) for i, n in enumerate(nodes)]
    differs, changes = _recompiles.why((GRAPH, ops), parts, None, labels, nested=True)
    distinct = list(dict.fromkeys(str(op) for op in ops))
    if _CACHE_ONLY[0]:
        raise CacheMissError(
            f"torch_tpu cache-only mode: DeferAndFuse graph {name} of {len(nodes)} ops "
            f"({', '.join(distinct[:8])}{', ...' if len(distinct) > 8 else ''}; recorded up "
            f"to {where}) has no compiled program: "
            f"{differs if changes else reason or 'no graph of these ops was compiled'}")
    rec = Program(GRAPH, name, where, cache, key, reason or "first graph of these ops")
    body.__name__ = body.__qualname__ = name
    rec.fn = jax.jit(body, donate_argnums=donate)
    rec.label = (f"DeferAndFuse {name}", {"ops": "; ".join(distinct), "nodes": len(nodes)})
    _pin(rec, [n.entry for n in nodes])
    # a site: these ops, recorded up to this user line
    _recompiles.storm((GRAPH, ops, line), f"DeferAndFuse graph {name} ({len(nodes)} ops)", line,
                      parts, labels, nested=True)
    _admit(rec, id(rec))
    return rec


def admit_captured(cache, key, make, name, where):
    """A captured region's program (eager/capture.py), compiled now: `make()` -> (its call,
    jax's Compiled, the op entries its graph names by id, pinned while it is held), stored
    as `cache[key]` under the one bound. The graph that captured it holds it too, so an
    eviction only keeps a later equal capture from sharing it."""
    if _CACHE_ONLY[0]:
        raise CacheMissError(f"torch_tpu cache-only mode: the region captured at {where} "
                             f"({name}) has no compiled program")
    rec = Program(GRAPH, name, where, cache, key, "first capture of this region")
    _bound_maps(rec)
    t0 = time.perf_counter()
    with _cache.watch() as mine:
        value = make()
    rec.seconds = time.perf_counter() - t0
    metrics.compile_seconds[0] += rec.seconds
    rec.compiled = True
    if mine:
        rec.disk = all(hit for hit, _ in mine)
        _COUNT[f"programs.{GRAPH}.{'disk_hits' if rec.disk else 'xla_compiles'}"] += 1
    rec.nbytes = CPU_PROGRAM_BYTES if _runtime.platform() == "cpu" else _compiled_bytes(value[1])
    cache[key] = value
    _pin(rec, value[2])
    with _lock:
        _held[GRAPH][1] += rec.nbytes
    _admit(rec, id(value))
    return value


def touch(value) -> None:
    """A program found in its cache: now the most recently used."""
    try:
        _move(id(value))
    except KeyError:
        pass


def _pin(rec, entries) -> None:
    """A graph names its op entries by id: the cached ones stay while it is held."""
    with _lock:
        pins = [_LRU.get(id(e)) for e in entries]
        rec.pins = tuple({id(p): p for p in pins if p is not None}.values())
        for p in rec.pins:
            p.pinned += 1


def _node_label(i, node):
    plan = node.entry.key[0]
    return (f"op {i} ({plan})", getattr(plan, "names", ()))


# ---------------------------------------------------------------- compiled graphs
def admit_compiled(cache, key, jitted, program, names) -> Program:
    """A torch.compile graph's executable for one input layout (`key`), stored by the
    caller in `cache`; `program` is its compile.program.Program (name, site)."""
    # (by name, not the Program: these tables must not keep a dropped graph alive)
    reason, _ = _recompiles.why((COMPILED, program.name), key[:-1], key[-1], names)
    if _CACHE_ONLY[0]:
        raise CacheMissError(f"torch_tpu cache-only mode: compiled graph {program.name} has "
                             f"no program for these inputs: {reason}")
    rec = Program(COMPILED, program.name, program.name, cache, key, reason, key[-1])
    rec.fn = jitted
    rec.label = (f"torch.compile {program.name}", {})
    _recompiles.storm((COMPILED, program.name), f"compiled graph {program.name}", None, key[:-1],
                      names)
    _admit(rec, id(rec))
    return rec


# ---------------------------------------------------------------- admission, eviction
def _admit(rec, ident):
    rec.ident = ident
    with _lock:
        _LRU[ident] = rec
        _held[rec.kind][0] += 1
        _evict(ident)
    ADMITTED[0] = True


def add_alias(entry, table, key) -> bool:
    """Whether `table[key]` may name the cached op entry `entry` (capacity's calls made in
    C): the key leaves `table` when the entry's program is evicted, so that no other table
    keeps its executable alive. False when the entry is not cached, or has many aliases."""
    with _lock:
        rec = _LRU.get(id(entry))
        if rec is None or rec.owner.get(rec.key) is not entry or len(rec.aliases) >= 4096:
            return False
        if not rec.aliases:
            rec.aliases = []
        rec.aliases.append((table, key))
        return True


def held() -> dict:
    """kind -> (programs held, their bytes)."""
    return {k: tuple(h) for k, h in _held.items()}


def summaries() -> list:
    """Every held program that was compiled (or is a graph or compiled graph), summarized."""
    with _lock:
        return [r.summary() for r in _LRU.values() if r.compiled or r.kind != OP]


def is_held(rec) -> bool:
    """Whether a program is still cached (not evicted: a caller holding it must not run it)."""
    return _LRU.get(rec.ident) is rec


def _evict(keep=None):
    """Drop least recently used programs until both bounds hold (never `keep`, the one
    just admitted, nor an op program a cached graph pins)."""
    total_n = sum(h[0] for h in _held.values())
    total_b = sum(h[1] for h in _held.values())
    if total_n <= _limits["programs"] and total_b <= _limits["bytes"]:
        return
    for ident in list(_LRU):
        if total_n <= _limits["programs"] and total_b <= _limits["bytes"]:
            break
        rec = _LRU[ident]
        if ident == keep or rec.pinned:
            continue
        del _LRU[ident]
        rec.owner.pop(rec.key, None)
        for table, key in rec.aliases:
            table.pop(key, None)
        held = _held[rec.kind]
        held[0] -= 1
        held[1] -= rec.nbytes
        total_n -= 1
        total_b -= rec.nbytes
        for p in rec.pins:
            p.pinned -= 1
        rec.pins = ()
        _COUNT[f"programs.{rec.kind}.evictions"] += 1


def _bound_maps(rec) -> None:
    """Before a program compiles or loads: past _maps.HIGH of the process's mapping limit,
    lower the program bound to what brings the mappings to _maps.LOW; past _maps.REFUSE
    (the process's own mappings), refuse the program (_maps.py says why)."""
    now = _maps.due()
    if now is None or now <= _maps.HIGH * _maps.LIMIT:
        return
    with _lock:
        held = sum(h[0] for h in _held.values())
        keep = _maps.programs_to_keep(now, held)
        if keep < _limits["programs"]:
            _limits["programs"] = keep
            _COUNT["programs.map_limited"] += 1
            _evict()
            now = _maps.count()
        held = sum(h[0] for h in _held.values())
    _maps.refuse_past_limit(now, f"the {rec.kind} program {rec.name} (at {rec.where})", held)


# ---------------------------------------------------------------- the first call
_AHEAD: list = []  # the worker threads of compile_ahead, made on first use
os.register_at_fork(after_in_child=_AHEAD.clear)  # a child has none of its parent's threads


def compile_ahead(rec, specs, fn=None) -> None:
    """Start the XLA compile of a program (`rec`: a compiled graph's, from admit_compiled,
    whose jit is rec.fn; or an op's, whose jit is `fn`, for Strict's compile window) on a
    worker thread, for arguments like `specs` (jax.ShapeDtypeStructs with the device's
    sharding, or the arrays themselves). Its first call waits for the work, then finds the
    executable in jax's caches; a prediction that missed costs a compile and no error: the
    call compiles its own (counted: compile.ahead, compile.ahead_hits). XLA's compile
    releases the GIL, so a training step's forward and backward programs compile at once,
    while torch goes on. (For a compiled graph's two programs, on XLA:CPU with 2 cores,
    that gained nothing: XLA's own compile threads already fill both; docs/PERFORMANCE.md,
    bench compile's notes. An eager first step's many small programs do gain: the
    window's notes.)"""
    if rec.ahead is not None:
        return
    _bound_maps(rec)
    jitted = rec.fn if fn is None else fn
    if not _AHEAD:
        import concurrent.futures

        _AHEAD.append(concurrent.futures.ThreadPoolExecutor(2, "torch_tpu-compile"))

    def work():
        t0 = time.perf_counter()
        with _cache.watch() as mine:
            jitted.lower(*specs).compile()
        return mine, time.perf_counter() - t0

    rec.ahead = _AHEAD[0].submit(work)
    _AHEAD_PENDING.add(rec)
    _COUNT["compile.ahead"] += 1


# programs whose compile_ahead work their first call has not collected: until then jax's
# lowering caches must keep what leads that call to the executable compiled ahead
_AHEAD_PENDING: weakref.WeakSet = weakref.WeakSet()


def _placed():
    """Where a program with no device inputs (a factory) is compiled for: JAX's default
    device, the current tpu device's while it is not tpu:0 (several devices per process;
    each device's programs are keyed apart: OpPlan.on_device)."""
    return jax.default_device(_runtime.device()) if _C.slot() else contextlib.nullcontext()


def _first_run(rec, fn, args):
    dump = _config.get("TORCH_TPU_DUMP_DIR")
    cpu = _runtime.platform() == "cpu"
    specs = _specs(args) if dump is not None or not cpu else None
    _bound_maps(rec)
    # (written before the compile too: a compile that kills the process leaves its program)
    path = _dump(dump, rec, fn, specs) if dump is not None else None
    early, early_s = _await_ahead(rec)
    t0 = time.perf_counter()
    with _cache.watch() as mine, _placed():
        if rec.label is not None and (PROFILING[0] or _torch_profiling()):
            with annotate(rec.label[0], **rec.label[1]):
                out = fn(*args)
        else:
            out = fn(*args)
    rec.seconds = time.perf_counter() - t0 + early_s
    metrics.compile_seconds[0] += rec.seconds  # where XLA compiles: the first call
    rec.compiled = True
    if early and not mine:
        _COUNT["compile.ahead_hits"] += 1
    mine = early + mine
    if mine:
        rec.disk = all(hit for hit, _ in mine)
        _COUNT[f"programs.{rec.kind}.{'disk_hits' if rec.disk else 'xla_compiles'}"] += 1
    # its key fixes every input's layout (csrc/direct.cpp); built before the eviction
    # below, which then also bounds what jax's lowering kept. (A donating program keeps
    # jit's call: its first call consumed the buffer that the direct call's lowering reads.)
    if rec.kind != GRAPH and not rec.donates:
        with _placed():  # (its lowering is placed as the first call's was)
            rec.fn = _runtime.direct_call(fn, args, PROFILING)
    nbytes = CPU_PROGRAM_BYTES if cpu else _code_bytes(fn, specs)
    with _lock:
        if _LRU.get(rec.ident) is rec:  # (not evicted meanwhile)
            rec.nbytes = nbytes
            _held[rec.kind][1] += nbytes
            _evict(rec.ident)
    if dump is not None:
        _dump(dump, rec, fn, specs, path)
    # jax would keep the program's lowered module as long as `fn` lives (_jax_internals)
    if not _AHEAD_PENDING:
        _jax_internals.forget_lowerings()
    return out


def _await_ahead(rec):
    """compile_ahead's events and seconds, once its work is done (none if it failed: the
    first call then compiles, and raises what it should)."""
    ahead, rec.ahead = rec.ahead, None
    _AHEAD_PENDING.discard(rec)
    if ahead is None:
        return [], 0.0
    try:
        return ahead.result()
    except Exception:  # noqa: BLE001  (the call itself reports a lowering error)
        return [], 0.0


def _specs(args):
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
            if isinstance(a, jax.Array) else a for a in args]


def _code_bytes(fn, specs):
    try:
        return _compiled_bytes(fn.lower(*specs).compile())  # (jax's caches: ~0.3 ms)
    except Exception:  # noqa: BLE001  (a lowering that fails here fails at the call)
        return CPU_PROGRAM_BYTES


def _compiled_bytes(compiled):
    try:
        ma = compiled.memory_analysis()
        return int(ma.generated_code_size_in_bytes + ma.host_generated_code_size_in_bytes) \
            or CPU_PROGRAM_BYTES  # a platform that reports none, as XLA:CPU
    except Exception:  # noqa: BLE001  (a platform without memory stats: the CPU figure)
        return CPU_PROGRAM_BYTES


def _dump(folder, rec, fn, specs, path=None):
    """TORCH_TPU_DUMP_DIR: the program's StableHLO, headed by its key and reason; written
    to `path` again once it ran (its compile time known). -> the path."""
    try:
        text = fn.lower(*specs).as_text()
    except Exception as e:  # noqa: BLE001  (a dump must never break its program)
        text = f"// lowering for the dump failed: {e}"
    if path is None:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in rec.name)[:80]
        path = folder / f"{os.getpid()}-{next(_seq):05d}-{rec.kind}-{safe}.mlir"
    key = rec.key.hex() if isinstance(rec.key, bytes) else repr(rec.key)
    head = [f"kind: {rec.kind}", f"name: {rec.name}", f"where: {rec.where}",
            f"reason: {rec.reason}", f"precision: {rec.precision}",
            f"compile_seconds: {rec.seconds:.6f}" if rec.compiled else "compile: not yet run",
            f"disk_hit: {rec.disk}", f"key: {key}"]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"// {h}\n" for h in head) + text)
    except OSError as e:
        warnings.warn(f"torch_tpu: cannot write the program dump {path}: {e}")
    return path
