"""A compiled graph at run time: real tpu tensors in, one jitted XLA program, tensors out.

Calling a `Program` (AOTAutograd's boxed convention: one list of arguments):
  1. scan: each tpu tensor input gives its storage's flat buffer and its view spec
     (shape, strides, offset, buffer length and dtype). Inputs sharing a storage share
     one buffer. The specs (and any size arguments) key the executable cache: dynamo's
     guards fix shapes and dtypes, so at steady state there is one key per graph;
  2. run: the executable reads each input's view out of its buffer (as eager ops do),
     interprets the graph (lower.GraphLowering), writes mutated inputs back into their
     buffers, and returns every output as a flat buffer in the layout (strides) that the
     graph's fake tensors promised AOTAutograd;
  3. finish: new tpu tensors own the output buffers; mutated inputs' storages take their
     new buffers.
RNG: seeded nodes draw with keys from the tpu default generator's seed and offset, read
per call and advanced by the number of seeded nodes, the scheme eager uses per op: the
state goes in as inputs and comes out as the generator's new offset.
"""
from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import torch
from torch._prims_common import make_contiguous_strides_for

from .. import _C, _precision, _runtime, _storage, metrics
from .._program_cache import admit_compiled, compile_ahead, is_cache_only, is_held
from .._rng import default_generator, draw
from ..op.current import executor, flush_pending
from ..op.opcall import C_FAST_PATH, device_scalar
from .lower import GraphLowering

_empty = _C.empty_with_storage  # (shape, strides or None, dtype) -> (tensor, its storage)
_scan = _C.program_scan  # (kinds, args, memo) -> (parts, bufs, storages, offsets, same), or
#                          None: Program._scan
_results = _C.program_results  # (specs, flat, args) -> outputs: Program.__call__'s loop in C

IN_TPU, IN_CPU, IN_INT, IN_OTHER = range(4)
OUT_TPU, OUT_CPU, OUT_STATIC, OUT_INPUT, OUT_HOST = range(5)


def input_kind(v) -> int:
    if isinstance(v, torch.Tensor):
        return IN_TPU if v.device.type == "tpu" else IN_CPU
    if isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):
        return IN_INT
    return IN_OTHER


class _OutSpec:
    __slots__ = ("kind", "dtype", "jdt", "stride", "perm", "shape", "n", "value")

    def __init__(self, kind, dtype=None, stride=None, perm=None, value=None):
        self.kind = kind
        self.dtype = dtype
        self.jdt = _runtime.jax_dtype(dtype) if dtype is not None else None
        self.stride = stride    # strides of the result tensor when not contiguous
        self.perm = perm        # dims outermost-first, when the buffer is permuted
        self.value = value      # OUT_STATIC: the Python value; OUT_INPUT: input index
        self.shape = None       # set when traced
        self.n = None


class Executable:
    """One input layout's jitted program and how its results become tensors."""

    __slots__ = ("fn", "outs", "mut_storages", "results", "raw", "node_entry")

    def __init__(self, fn, outs, mut_storages, raw=None):
        self.fn = fn
        self.raw = raw                    # the traceable body that fn jits
        self.node_entry = None            # DeferAndFuse: its pending nodes' entry (_GraphEntry)
        self.outs = outs                  # [_OutSpec], filled in by the first trace
        self.mut_storages = mut_storages  # buffer indices the program returns new buffers for
        self.results = None               # after the first call: the outs as _results' specs,
        #                                   or False (a CPU or host output: the loop below)


class Program:
    """A lowered FX graph and its executables, one per input layout."""

    def __init__(self, gm, example_inputs, name: str):
        t0 = time.perf_counter()
        self.name = name
        self.kinds = [input_kind(x) for x in example_inputs]
        self.graph = GraphLowering(gm, [i for i, k in enumerate(self.kinds) if k == IN_CPU])
        # its device (dynamo guards on it: a graph's inputs are on one device), which a
        # process with several makes current for the graph's constants and calls
        self.index = next((x.device.index or 0 for x in example_inputs
                           if isinstance(x, torch.Tensor) and x.device.type == "tpu"), 0)
        with _runtime.on_device(self.index):
            consts = {k: _const_array(v) for k, v in self.graph.consts.items()}
        # a higher-order op's subgraphs (flex_attention's score_mod) are interpreted while
        # tracing, not passed to the program
        self.subgraphs = {k: v for k, v in consts.items() if isinstance(v, torch.fx.GraphModule)}
        self.consts = {k: v for k, v in consts.items() if k not in self.subgraphs}
        self.n_seeded = self.graph.n_seeded
        self.mutated = sorted(self.graph.mutated_inputs)
        # CPU inputs that device nodes write (host nodes write theirs on the host)
        self.cpu_mutated = [i for i in self.mutated if self.kinds[i] == IN_CPU]
        self.out_template = self._out_template()
        # host values: nodes run on CPU, or a CPU input handed back as an output (a graph
        # that only passes its inputs on, between two graph breaks: LightGlue's matching)
        self.has_host = bool(self.graph.host_pure or self.graph.host_mutating or
                             self.graph.feeds or any(s.kind == OUT_HOST
                                                     for s in self.out_template))
        self.cache: dict = {}
        # the last call's layout (program_scan's memo) and (precision, executable): a call
        # laid out the same skips building and hashing its key (with program_results: the
        # small Llama's training step 1.03-1.07x faster, docs/PERFORMANCE.md).
        # TORCH_TPU_C_FAST_PATH=0: always the key, the reference.
        self.memo = [None, None] if C_FAST_PATH else None
        self.last = None
        # DeferAndFuse records a call as one node (_record), fused with the eager ops and
        # graphs around it; not graphs that read or write host values
        self.deferrable = not (self.has_host or self.cpu_mutated) and all(
            s.kind not in (OUT_CPU, OUT_HOST) for s in self.out_template) and all(
            isinstance(c, jax.Array) for c in self.consts.values())
        metrics.count("compile.graphs")
        metrics.compile_seconds[0] += time.perf_counter() - t0

    def _out_template(self):
        specs = []
        ph = self.graph.ph_index
        for a in self.graph.output_node.args[0]:
            if isinstance(a, torch.fx.Node) and a in self.graph.host:
                specs.append(_OutSpec(OUT_HOST, value=a))
                continue
            if isinstance(a, torch.fx.Node):
                meta = a.meta.get("val")
                if isinstance(meta, torch.Tensor):
                    if a.op == "placeholder" and ph[a] not in self.graph.mutated_inputs \
                            and self.kinds[ph[a]] == IN_TPU:
                        # an input returned as is: AOTAutograd regenerates such aliases
                        # from the input, so hand back the input itself, no copy
                        specs.append(_OutSpec(OUT_INPUT, value=ph[a]))
                        continue
                    kind = OUT_TPU if meta.device.type == "tpu" else OUT_CPU
                    order = _storage.dense_order(tuple(meta.shape), tuple(meta.stride()))
                    contiguous = order is None or order == list(range(meta.dim()))
                    perm = None if contiguous else order
                    stride = None if contiguous else tuple(meta.stride())
                    specs.append(_OutSpec(kind, meta.dtype, stride, perm))
                    continue
            specs.append(_OutSpec(OUT_STATIC))
        return specs

    # ------------------------------------------------------------ per call
    def __call__(self, args):
        if _C.multi() and self.index != _C.current_index():  # (several devices: its own)
            with _runtime.on_device(self.index):
                return self._run(args)
        return self._run(args)

    def _run(self, args):
        if self.deferrable:  # the mode runs it now (Strict) or records it (`call`'s ex)
            return executor().graph(self, args)
        flush_pending("compiled_graph")  # deferred eager work writes the buffers read here
        return self.call(args, None)

    def call(self, args, ex):
        kinds = self.kinds
        extra = []
        # C; None when an input's storage has no buffer yet
        parts, bufs, storages, offsets, same = _scan(kinds, args, self.memo) or self._scan(args)
        henv = None
        host = ()
        prec = _precision.snapshot()  # the float32 matmul/conv precision: the key's last part
        last = self.last
        if self.has_host:
            henv = {}
            self.graph.run_host(args, False, henv)
            feeds = [henv[n] for n in self.graph.feeds]
            host = (tuple((f.shape, f.dtype) for f in feeds),)
            extra.extend(_pack(feeds))
            self.graph.run_host(args, True, henv)  # the epilogue writes CPU inputs
            exe = None
        elif same and last is not None and last[0] == prec and is_held(last[1].fn):
            exe = last[1]
            metrics.counters["compile.same_layout"] += 1
        else:
            exe = None
        if exe is None:
            key = (*parts, *host, prec)
            exe = self.cache.get(key)
            if exe is None:
                exe = self._build(key, len(bufs), len(offsets))
                self.cache[key] = exe
            self.last = (prec, exe)
        if ex is not None:  # (a deferrable graph: its results stay on the device)
            if exe.results is None:
                # its results' specs from an abstract trace: a first call records too, and
                # compiles only inside the graph it joins (not also on its own)
                specs = [jax.ShapeDtypeStruct((n,), jdt) for _, n, jdt in
                         (getattr(st, _storage.ATTR) for st in storages)]
                jax.eval_shape(exe.raw, *specs, *offsets, *([0, 0] if self.n_seeded else ()),
                               *self.consts.values())
                _settle(exe)
            return self._record(ex, exe, bufs, storages, offsets, args)
        if self.n_seeded:
            extra.extend(draw(default_generator(), self.n_seeded))
        metrics.counters["compile.calls"] += 1
        _runtime.check_not_forked()
        try:
            flat_outs, new_bufs = exe.fn(*bufs, *offsets, *extra, *self.consts.values())
        except jax.errors.JaxRuntimeError as e:
            _runtime.raise_if_out_of_memory(e, f"running compiled graph {self.name}")
            raise
        _C.replace_buffers(storages, exe.mut_storages, new_bufs)  # the storages it wrote
        for i, buf in zip(self.cpu_mutated, new_bufs[len(exe.mut_storages):]):
            args[i].copy_(_runtime.to_host(buf, args[i].dtype).reshape(args[i].shape))
        if C_FAST_PATH and exe.results not in (None, False):
            outs = _results(exe.results, flat_outs, args)
            args.clear()
            return outs
        outs = []
        it = iter(flat_outs)
        for spec in exe.outs:
            kind = spec.kind
            if kind == OUT_TPU:
                flat = next(it)
                t, st = _empty(spec.shape, spec.stride, spec.dtype)
                _storage.set_buffer(st, flat, spec.n, spec.jdt)
                outs.append(t)
            elif kind == OUT_INPUT:
                outs.append(args[spec.value])
            elif kind == OUT_CPU:  # (the buffer is in memory order, as a tpu output's)
                host = _runtime.to_host(next(it), spec.dtype)
                outs.append(host.reshape(spec.shape) if spec.stride is None
                            else host.as_strided(spec.shape, spec.stride))
            elif kind == OUT_HOST:
                outs.append(henv[spec.value])
            else:
                outs.append(spec.value)
        args.clear()  # the boxed convention: let inputs die as early as possible
        if exe.results is None:
            _settle(exe)
        return outs

    def _record(self, ex, exe, bufs, storages, offsets, args):
        """DeferAndFuse: the call as a pending node; its results' buffers are Lazy."""
        entry = exe.node_entry
        if entry is None:
            entry = exe.node_entry = _GraphEntry(self, exe, len(bufs))
        outs, fresh = [], []
        for s in exe.results:
            if s[0] == OUT_TPU:
                t, st = _empty(s[1], s[2], s[3])
                fresh.append((st, s[4], s[5]))
                outs.append(t)
            else:  # an input, or a static value
                outs.append(args[s[1]] if s[0] == OUT_INPUT else s[1])
        fresh += [(storages[j], *getattr(storages[j], _storage.ATTR)[1:]) for j in exe.mut_storages]
        dyns = [*offsets, *draw(default_generator(), self.n_seeded)] if self.n_seeded else offsets
        ex.record_graph(entry, [*bufs, *self.consts.values()], dyns, fresh)
        metrics.counters["compile.calls"] += 1
        args.clear()
        return outs

    def _scan(self, args):
        """program_scan left this call to Python: an input's storage has no buffer yet.
        Give those storages theirs (zeros, as any fresh storage gets), then scan again."""
        for k, a in zip(self.kinds, args):
            if k == IN_TPU:
                _storage.record(a.untyped_storage(), a.dtype)
        scanned = _scan(self.kinds, args, self.memo)
        if scanned is None:
            raise RuntimeError("torch_tpu: a compiled graph's tpu input could not be read "
                               "(not a tensor with a device buffer)")
        return scanned

    # ------------------------------------------------------------ compiled ahead
    def compile_ahead(self, example_inputs) -> bool:
        """Build the executable for the layout the example (fake) inputs promise and start
        its XLA compile on a worker thread (_program_cache.compile_ahead); the first call
        with that layout waits for it. Graphs whose call adds data the fakes cannot say
        (host values, RNG draws, sizes) compile at their first call, as before, and so
        does every graph in cache-only mode, whose refusal belongs to the call. Returns
        whether a compile started."""
        if self.has_host or self.n_seeded or is_cache_only():
            return False
        # a backward's inputs other than the forward's own inputs (primals_*) are the forward
        # program's results and the tangents: each arrives in a flat buffer of its own
        fresh = [self.name.startswith("backward") and not ph.name.startswith("primals")
                 for ph in self.graph.placeholders]
        key, bufs, offsets = self._promised(example_inputs, fresh)
        if key is None or key in self.cache:
            return False
        exe = self.cache[key] = self._build(key, len(bufs), len(offsets))
        compile_ahead(exe.fn, [*bufs, *offsets, *self.consts.values()])
        return True

    def _promised(self, example_inputs, fresh):
        """What the scan (csrc/scan_graph.cpp program_scan) will make of inputs laid out as these:
        the key, the buffers' avals and the offsets passed as data; Nones when the
        example cannot tell. An input marked `fresh` comes as a program result does
        (Program.__call__): a buffer of its own, dense in the fake's layout, else
        contiguous."""
        parts, bufs, offsets, index = [], [], [], {}
        sharding = jax.sharding.SingleDeviceSharding(_runtime.device())
        for kind, x, own in zip(self.kinds, example_inputs, fresh):
            if kind == IN_CPU:
                parts.append(None)
                continue
            if kind != IN_TPU:
                if kind == IN_INT:
                    return None, None, None
                parts.append(x)
                continue
            if x.is_conj() or x.is_neg() or not all(
                    type(n) is int for n in (*x.shape, *x.stride(), x.storage_offset())):
                return None, None, None
            shape, stride, offset = tuple(x.shape), tuple(x.stride()), x.storage_offset()
            jdt = _runtime.jax_dtype(x.dtype)
            if own:
                if _storage.dense_order(shape, stride) is None:
                    stride = tuple(make_contiguous_strides_for(shape))
                blen, offset, ident = math.prod(shape), 0, ("own", len(parts))
            else:
                st = x.untyped_storage()
                # (a view of a base whose size is symbolic has a symbolic storage size,
                # though its own sizes are ints: the fakes cannot tell the buffer)
                if type(st.nbytes()) is not int or st.nbytes() % x.element_size():
                    return None, None, None
                blen, ident = st.nbytes() // x.element_size(), st._cdata
            j = index.setdefault(ident, len(index))
            if j == len(bufs):
                bufs.append(jax.ShapeDtypeStruct((blen,), jdt, sharding=sharding))
            elif bufs[j].shape != (blen,) or bufs[j].dtype != jdt:
                return None, None, None  # one storage seen in two dtypes
            if _storage.offset_is_data(shape, stride, offset, blen, jdt, x.dtype):
                offsets.append(device_scalar(offset))
                offset = _storage.DYNAMIC
            parts.append((shape, stride, offset, x.dtype, blen, jdt, j))
        parts.append(_precision.snapshot())
        return tuple(parts), bufs, offsets

    # ------------------------------------------------------------ per input layout
    def _build(self, key, nbufs, noffsets):
        t0 = time.perf_counter()
        graph = self.graph
        kinds = self.kinds
        outs = [_OutSpec(s.kind, s.dtype, s.stride, s.perm, s.value) for s in self.out_template]
        # storages the graph writes, in a fixed order: their new buffers come back
        mut_storages = sorted({key[i][6] for i in self.mutated if kinds[i] == IN_TPU})
        feed_specs = key[len(kinds)] if self.has_host else ()
        npacks = len(_pack_groups(feed_specs))
        seeded = self.n_seeded > 0
        const_names, subgraphs = list(self.consts), self.subgraphs
        placeholders = graph.placeholders
        feed_nodes = graph.feeds

        def run(*flat):
            bufs = flat[:nbufs]
            offsets = iter(flat[nbufs:nbufs + noffsets])  # the DYNAMIC ones, in input order
            rest = flat[nbufs + noffsets:]
            packs = rest[:npacks]
            seed, offset = (rest[npacks], rest[npacks + 1]) if seeded else (0, 0)
            consts = dict(zip(const_names, rest[npacks + 2 * seeded:]), **subgraphs)
            current = list(bufs)   # storage buffers, updated by in-graph writes
            env = {}
            offset_of = {}  # input index -> its offset, static or passed as data
            for i, (ph, k, part) in enumerate(zip(placeholders, kinds, key)):
                if k == IN_TPU:
                    shape, stride, offset_, dtype, blen, bdt, j = part
                    off = offset_of[i] = next(offsets) if offset_ == _storage.DYNAMIC else offset_
                    env[ph] = _storage.reader(tuple(shape), tuple(stride), offset_, blen,
                                              bdt, dtype)(bufs[j], off)
                elif k != IN_CPU:
                    env[ph] = part
            env.update(zip(feed_nodes, _unpack(packs, feed_specs)))
            cpu_new = {}

            def write(i, value):
                if kinds[i] == IN_CPU:
                    cpu_new[i] = value
                    return
                shape, stride, offset_, dtype, blen, bdt, j = key[i]
                value = jnp.broadcast_to(value.astype(_runtime.jax_dtype(dtype)), tuple(shape))
                w = _storage.writer(tuple(shape), tuple(stride), offset_, blen, bdt, dtype)
                current[j] = w(current[j], value, offset_of[i])

            results = graph.trace(env, consts, seed, offset, write)
            flat_outs = []
            for spec, r in zip(outs, results):
                if spec.kind in (OUT_TPU, OUT_CPU):
                    spec.shape = tuple(r.shape)
                    spec.n = r.size
                    x = jnp.transpose(r, spec.perm) if spec.perm is not None else r
                    flat_outs.append(x.reshape(-1))
                elif spec.kind == OUT_STATIC:
                    spec.value = r
            new_bufs = [current[j] for j in mut_storages]
            new_bufs += [cpu_new[i] for i in self.cpu_mutated]
            return flat_outs, new_bufs

        metrics.count("compile.executables")
        if len(self.cache):
            metrics.count("compile.respecializations")
        run.__name__ = "tpu_" + self.name.rstrip("0123456789")  # its XLA module's name
        raw = _precision.binding(run, key[-1])
        jitted = jax.jit(raw, compiler_options=_compiler_options())
        exe = Executable(None, outs, mut_storages, raw)
        # the program is timed on its first call (the compile), bounded in the LRU of all
        # programs, warned about when new shapes keep compiling it: _program_cache
        exe.fn = admit_compiled(self.cache, key, jitted, self,
                                [ph.name for ph in placeholders])
        metrics.compile_seconds[0] += time.perf_counter() - t0
        return exe


def _settle(exe) -> None:
    """Decide the executable's `results` once its trace filled the output specs: the
    fresh results' (shape, strides, dtype, length) and what the others are, or False when
    a result comes back to the host (such a call cannot be a pending node)."""
    exe.results = all(s.kind in (OUT_TPU, OUT_INPUT, OUT_STATIC) for s in exe.outs) and tuple(
        (s.kind, s.shape, s.stride, s.dtype, s.n, s.jdt) if s.kind == OUT_TPU
        else (s.kind, s.value) for s in exe.outs)


class _GraphEntry:
    """A compiled graph's executable as a DeferAndFuse node's entry (eager/fuse.py): its
    body takes the call's buffers, the graph's constants, then the scalars (offsets, RNG
    seed and offset); it returns the results' flat buffers, then the written storages'."""

    __slots__ = ("raw", "key", "checks")

    def __init__(self, program, exe, nbufs):
        run, nconst = exe.raw, len(program.consts)

        def raw(*a):
            flat_outs, new_bufs = run(*a[:nbufs], *a[nbufs + nconst:], *a[nbufs:nbufs + nconst])
            return [*flat_outs, *new_bufs]

        self.raw = raw
        self.key = (f"compiled {program.name}", ())
        self.checks = None


def _compiler_options():
    """XLA:CPU at LLVM -O1 for whole graphs: it compiles the small Llama's forward graph
    in ~55% of the default (-O2) time, and ran it as fast (1.48 vs 1.50 ms, medians of
    40 interleaved runs): the time goes to library GEMM calls and memory-bound fusions
    that -O2 does not speed up. Other platforms keep their defaults."""
    if _runtime.platform() == "cpu":
        return {"xla_backend_optimization_level": 1}
    return None


def _pack_groups(specs):
    """Feeds grouped by dtype: dtype -> [feed index], in order."""
    groups = {}
    for i, (shape, dtype) in enumerate(specs):
        groups.setdefault(dtype, []).append(i)
    return groups


def _pack(feeds):
    """Host values the program reads, as one transfer per dtype (they are mostly
    0-dim optimizer scalars: a transfer each would cost more than the math)."""
    out = []
    for dtype, idx in _pack_groups([(f.shape, f.dtype) for f in feeds]).items():
        cat = torch.cat([feeds[i].reshape(-1) for i in idx]) if len(idx) > 1 else feeds[idx[0]].reshape(-1)
        out.append(_runtime.to_device(cat))
    return out


def _unpack(packs, specs):
    """Inside the program: the packed feeds back as arrays of their shapes, in order."""
    values = [None] * len(specs)
    for flat, (dtype, idx) in zip(packs, _pack_groups(specs).items()):
        pos = 0
        for i in idx:
            shape = tuple(specs[i][0])
            n = math.prod(shape)
            values[i] = flat[pos:pos + n].reshape(shape)
            pos += n
    return values


def _const_array(t):
    """A tensor the graph holds as a constant (get_attr) -> a JAX array of its shape. (The
    graph may be lowered while AOTAutograd's fake mode is on: a constant is real data.)"""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if not isinstance(t, torch.Tensor):
        return t
    with unset_fake_temporarily():
        if t.device.type == "tpu":
            from .._transfer import materialize

            return materialize(t)
        return _runtime.to_device(t.detach().contiguous()).reshape(tuple(t.shape))
