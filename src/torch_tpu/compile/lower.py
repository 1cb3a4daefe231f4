"""An AOTAutograd aten graph -> one JAX function, node by node through the lowering table.

Every `call_function` node on an OpOverload is lowered by `registry.lookup(op)`, the table
the eager modes use, called with the same convention (schema order, kwarg-only arguments
as keywords, Python scalars as weakly typed JAX scalars, `generator=` a JAX key for seeded
ops), and its results are cast to the dtypes in `node.meta["val"]`, torch's own rules.

A few ops never reach the table in eager mode, because C++ kernels or torch's composite
kernels handle them before a lowering is looked up. In a functional graph they are plain
value ops, so a compile-only rule (`registry.lowering(..., graph_only=True)`, the table's
GRAPH_ONLY part) gives each its meaning here, with the reason:
  - views (`view`, `t`, `slice`, ...): the table has their functional `*_copy` twins;
  - factories (`empty`, `full`, `zeros`, `scalar_tensor`, `rand`, ...): eager builds them
    from `empty` (C++) and `fill_`/`uniform_`, so the graph builds them from the result's
    shape and dtype in node.meta;
  - `_to_copy`, `detach`, `alias`, `lift_fresh_copy`: no new values, only a dtype cast;
  - `_assert_tensor_metadata` (torch.export's graphs): the trace's shapes already hold it;
  - activation offloading's moves (`prims.device_put`, `ao.offload`/`reload`/`wait_tensor`):
    the value, as a CPU output of the forward program and a host input of the backward.
Ops listed in lowering/decomp.py (torch's own decompositions, each with its reason) are
decomposed while AOTAutograd traces, so they arrive here as ops the table has.
"""
from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import torch
import torch._functorch._activation_offloading.offload_ops  # noqa: F401  (torch.ops.ao.*)

from .. import _jax_internals, _runtime, _storage
from . import flex
from ..lowering import registry
from ..lowering.schema import (GENERATOR, OPT_TENSOR, OPT_TENSOR_LIST, SCALAR, SCALAR_KEYED,
                               SCALAR_LIST, TENSOR_LIST, OpSchema, keyed)

aten = torch.ops.aten


class UnsupportedGraph(Exception):
    """A graph this backend cannot lower; the backend runs it eagerly instead."""


# ---------------------------------------------------------------- per-overload facts
class OpInfo(OpSchema):
    """The schema's facts (lowering/schema.py, shared with eager) and how to call the
    lowering on a node's JAX values. `mutable` (in-place and out= ops) is rare after
    functionalization, but the input-mutation epilogue is copy_ into graph inputs."""

    __slots__ = ("wants_meta",)

    def __init__(self, op, fn, wants_meta):
        super().__init__(op, fn)
        self.wants_meta = wants_meta  # a compile-only rule: also gets meta=node.meta["val"]

    def normalize(self, args, kwargs):
        vals = list(args)
        for i in range(len(vals), self.npos):  # FX may pass positional ones by name
            vals.append(kwargs.get(self.names[i], self.defaults[i]))
        for i in range(self.npos, len(self.names)):
            vals.append(kwargs.get(self.names[i], self.defaults[i]))
        return vals

    def call(self, vals, key, meta):
        """Run the lowering on JAX values (tensors already read), scalars made weak."""
        kinds, names, npos = self.kinds, self.names, self.npos
        vals = [_jaxify(v, k) for v, k in zip(vals, kinds)]
        kw = {names[i]: vals[i] for i in range(npos, len(vals)) if kinds[i] != GENERATOR}
        if self.seeded:
            kw["generator"] = key
        if self.wants_meta:
            kw["meta"] = meta
        return self.lowering(*vals[:npos], **kw)


def _weak(v):
    """A Python number as eager passes it: a weakly typed JAX scalar (a traced argument
    there, a constant here), so promotion inside lowerings is the same in both."""
    if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
        return v
    return _jax_internals.convert_element_type(v, weak_type=True)


def _jaxify(v, kind):
    if kind == SCALAR_KEYED and keyed(v):
        return v  # a constant the lowering specializes on, as eager keys it
    if kind == SCALAR or kind == SCALAR_KEYED or kind <= OPT_TENSOR:
        return _weak(v)
    if kind in (SCALAR_LIST, TENSOR_LIST, OPT_TENSOR_LIST) and v is not None:
        return [_weak(x) for x in v]
    return v


_INFOS: dict = {}


def op_info(op):
    """OpInfo for `op`, or None when the table cannot lower it."""
    info = _INFOS.get(op)
    if info is None and op not in _INFOS:
        rule = registry.GRAPH_ONLY.get(op)
        fn = rule or registry.lookup(op) or _view_twin(op)
        info = _INFOS[op] = OpInfo(op, fn, rule is not None) if fn is not None else None
    return info


def _view_twin(op):
    """`aten.X.ov` (a view) -> the lowering of its functional twin `aten.X_copy.ov`."""
    if not op.is_view:
        return None
    ns = getattr(torch.ops, op.namespace)
    twin_packet = getattr(ns, op.overloadpacket.__name__ + "_copy", None)
    twin = getattr(twin_packet, op._overloadname, None) if twin_packet is not None else None
    return registry.LOWERINGS.get(twin) if twin is not None else None


# ---------------------------------------------------------------- compile-only rules
# Each rule takes the op's arguments like a lowering, plus `meta=` (node.meta["val"]): the
# factories read the result's shape and dtype from it.
def _rule(*ops):
    return registry.lowering(*ops, graph_only=True)


def _dtype(meta):
    return _runtime.jax_dtype(meta.dtype)


def _shape_of(v):
    """A factory's size argument, or the shape of the tensor a *_like factory copies."""
    return tuple(v.shape) if hasattr(v, "shape") else tuple(v)


class _Factory:
    """A factory: eager makes it from `empty` (C++) and fill_; here it is a constant of the
    shape its arguments give and the dtype torch's meta result has."""

    def __init__(self, size_arg, fill):
        self.size_arg = size_arg  # which argument holds the size (or the *_like tensor)
        self.fill = fill          # args -> fill value

    def __call__(self, *args, meta, **kwargs):
        shape = () if self.size_arg is None else _shape_of(args[self.size_arg])
        return jnp.full(shape, self.fill(args), _dtype(meta))


_rule(aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default,
      aten.zeros.default)(_Factory(0, lambda a: 0))
_rule(aten.new_empty.default, aten.new_empty_strided.default,
      aten.new_zeros.default)(_Factory(1, lambda a: 0))
_rule(aten.zeros_like.default, aten.empty_like.default)(_Factory(0, lambda a: 0))
_rule(aten.ones.default, aten.ones_like.default)(_Factory(0, lambda a: 1))
_rule(aten.new_ones.default)(_Factory(1, lambda a: 1))
_rule(aten.full.default, aten.full_like.default)(_Factory(0, lambda a: a[1]))
_rule(aten.new_full.default)(_Factory(1, lambda a: a[2]))
_rule(aten.scalar_tensor.default)(_Factory(None, lambda a: a[0]))


@_rule(aten._to_copy.default, aten.lift_fresh_copy.default, aten.detach.default,
       aten.alias.default, aten.lift_fresh.default)
def _same_value(self, *args, meta=None, **kwargs):
    # the dtype cast (and for _to_copy a device move) comes from meta, like every node
    return self


@_rule(torch.ops.prims.device_put.default, torch.ops.ao.offload.default,
       torch.ops.ao.reload.default, torch.ops.ao.wait_tensor.default)
def _moved(self, *args, meta=None, **kwargs):
    # activation offloading (torch._functorch.config.enable_activation_offloading): a saved
    # activation leaves the forward program as a CPU output (the Program copies it to the
    # host, and its device buffer dies with the step's), and enters the backward program
    # as a host input it uploads; inside a program the value itself is unchanged
    return self


@_rule(aten._assert_tensor_metadata.default)
def _metadata_checked(*args, meta=None, **kwargs):
    # torch.export's check of an input's size, stride and dtype: the trace already holds
    # them (its fake tensors), so the program has nothing to do
    return ()


@_rule(aten._unsafe_view.default, aten._reshape_alias.default)
def _unsafe_view(self, size, *args, meta=None):
    return jnp.reshape(self, tuple(size))


@_rule(aten.view.dtype)
def _view_dtype(self, dtype, meta=None):
    # torch: the last dim scales by the itemsize ratio
    to = _runtime.jax_dtype(dtype)
    flat = _storage._bitcast_flat(self.reshape(-1), to)
    last = self.shape[-1] * self.dtype.itemsize // to.itemsize if self.ndim else 1
    return flat.reshape(self.shape[:-1] + (last,) if self.ndim else ())


@_rule(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(self, size, stride, storage_offset=None, meta=None):
    # meaningful on a value only when it is its whole storage, contiguous: checked per
    # node by GraphLowering (AOTAutograd's synthetic bases for aliased inputs are such)
    flat = self.reshape(-1)
    read = _storage.reader(tuple(size), tuple(stride), storage_offset or 0, flat.shape[0],
                           flat.dtype, meta.dtype)
    return read(flat)


@_rule(aten.as_strided_scatter.default)
def _as_strided_scatter(self, src, size, stride, storage_offset=None, meta=None):
    flat = self.reshape(-1)
    write = _storage.writer(tuple(size), tuple(stride), storage_offset or 0, flat.shape[0],
                            flat.dtype, meta.dtype)
    return write(flat, src.astype(flat.dtype)).reshape(self.shape)


@_rule(aten.split.Tensor)
def _split(self, split_size, dim=0, meta=None):
    d = dim % self.ndim
    n = self.shape[d]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if n else [0]
    return registry.LOWERINGS[aten.split_with_sizes_copy.default](self, sizes, d)


@_rule(aten.sym_size.int)
def _sym_size(self, dim, meta=None):
    return self.shape[dim]


@_rule(aten.sym_numel.default)
def _sym_numel(self, meta=None):
    return self.size


def _sampler(size_arg, draw):
    """A random factory: torch's composite fills `empty` with uniform_/normal_/random_,
    so the graph draws with those ops' lowerings into zeros of the result's shape. It
    needs a key whether or not its op's tags say so."""
    @registry.draws
    def rule(*args, meta, generator, **kwargs):
        base = jnp.zeros(_shape_of(args[size_arg]), _dtype(meta))
        return draw(base, args, generator)
    return rule


def _lowering(op):
    return registry.LOWERINGS[op]


_rule(aten.rand.default, aten.rand_like.default)(_sampler(
    0, lambda z, a, g: _lowering(aten.uniform.default)(z, 0.0, 1.0, generator=g)))
_rule(aten.randn.default, aten.randn_like.default)(_sampler(
    0, lambda z, a, g: _lowering(aten.normal_functional.default)(z, 0.0, 1.0, generator=g)))
_rule(aten.randint.default)(_sampler(
    1, lambda z, a, g: _lowering(aten.random.to)(z, a[0], generator=g)))
_rule(aten.randint.low)(_sampler(
    2, lambda z, a, g: _lowering(getattr(aten.random, "from"))(z, a[0], a[1], generator=g)))
_rule(aten.randint_like.default)(_sampler(
    0, lambda z, a, g: _lowering(aten.random.to)(z, a[1], generator=g)))
_rule(aten.randint_like.low_dtype)(_sampler(
    0, lambda z, a, g: _lowering(getattr(aten.random, "from"))(z, a[1], a[2], generator=g)))


# ---------------------------------------------------------------- the graph
class GraphLowering:
    """One FX graph, checked once, then interpreted on JAX values inside jax.jit.

    Nodes whose values torch keeps on the host (CPU scalars computed from CPU inputs,
    like a non-capturable optimizer's `step` counters and bias corrections) are the
    *host* part: they run eagerly on CPU before the program (`run_host`), and the program
    receives those of their values that device nodes read (`feeds`). Everything else is
    the device part, interpreted by `trace`. Raises UnsupportedGraph, naming the ops, when
    a device node has no lowering."""

    def __init__(self, gm: torch.fx.GraphModule, cpu_inputs=()):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.ph_index = {n: i for i, n in enumerate(self.placeholders)}
        self.output_node = next(n for n in reversed(self.nodes) if n.op == "output")
        self.consts = {}        # get_attr node name -> tensor
        self.seeded = {}        # device node -> its index among seeded nodes, in graph order
        self.mutated_inputs = set()
        self.host = {self.placeholders[i] for i in cpu_inputs}
        self.host_pure, self.host_mutating = [], []  # host nodes to run, in graph order
        missing = set()
        for n in self.nodes:
            if n.op == "get_attr":
                self.consts[n.name] = _fetch_attr(gm, n.target)
            elif n.op == "call_function":
                t = n.target
                if self._is_host(n):
                    self.host.add(n)
                    mutating = isinstance(t, torch._ops.OpOverload) and any(
                        a.alias_info is not None and a.alias_info.is_write
                        for a in t._schema.arguments)
                    (self.host_mutating if mutating else self.host_pure).append(n)
                    continue
                if isinstance(t, torch._ops.OpOverload):
                    info = op_info(t)
                    if info is None:
                        missing.add(str(t))
                        continue
                    if info.lowering in (_as_strided, _as_strided_scatter) \
                            and not _whole_storage(n.args[0]):
                        missing.add(f"{t} of a view (its storage is not in the graph)")
                    if info.seeded:
                        self.seeded[n] = len(self.seeded)
                    for i in info.mutable:
                        for target in _targets(_arg(n, info, i)):
                            if target.op == "placeholder":
                                self.mutated_inputs.add(self.ph_index[target])
                elif isinstance(t, torch._ops.OperatorBase) and t not in flex.HOPS:
                    missing.add(str(t))  # higher-order ops (cond, invoke_subgraph, ...)
            elif n.op in ("call_module", "call_method"):
                missing.add(f"{n.op} {n.target}")
        if missing:
            raise UnsupportedGraph(", ".join(sorted(missing)))
        self.n_seeded = len(self.seeded)
        # host values that device nodes read: the program's extra inputs
        self.feeds = [n for n in self.nodes if n in self.host and any(
            u not in self.host and u.op != "output" for u in n.users)]

    def _is_host(self, n) -> bool:
        """A CPU result computed only from host values (and constants)."""
        meta = n.meta.get("val")
        metas = meta if isinstance(meta, (list, tuple)) else [meta]
        if not metas or not all(isinstance(m, torch.Tensor) and m.device.type == "cpu"
                                for m in metas):
            if n.target is not operator.getitem:
                return False
        inputs = n.all_input_nodes
        return bool(inputs) and all(a in self.host for a in inputs)

    def run_host(self, args, mutating: bool, henv: dict) -> None:
        """Run the host nodes (pure ones, or the mutating epilogue) eagerly on CPU."""
        if not henv:
            for n in self.host:
                if n.op == "placeholder":
                    henv[n] = args[self.ph_index[n]]
        for n in (self.host_mutating if mutating else self.host_pure):
            henv[n] = n.target(*_lookup(n.args, henv), **_lookup(n.kwargs, henv))

    def trace(self, env, consts, seed, offset, write):
        """Interpret the device part on JAX values. `env` starts with every placeholder's
        value (a JAX array, or a Python int for a size) and every feed's. `write(i, value)`
        receives the new value of each graph input the graph mutates. Returns the output
        node's values (None where an output is a host value)."""
        base_key = jax.random.key(seed) if self.n_seeded else None
        seeded = self.seeded
        host = self.host
        for n in self.nodes:
            op = n.op
            if op == "call_function":
                if n in host:
                    continue
                args = _lookup(n.args, env)
                kwargs = _lookup(n.kwargs, env) if n.kwargs else {}
                t = n.target
                hop = flex.HOPS.get(t) if isinstance(t, torch._ops.HigherOrderOperator) else None
                if hop is not None:  # (its subgraph arguments as JAX functions)
                    args = _subgraphs(args)
                    env[n] = _cast_like(hop(*args, **kwargs, meta=n.meta.get("val")),
                                        n.meta.get("val"))
                    continue
                if not isinstance(t, torch._ops.OpOverload):
                    env[n] = t(*args, **kwargs)  # operator.getitem, SymInt arithmetic
                    continue
                info = _INFOS[t]
                meta = n.meta.get("val")
                key = None
                if n in seeded:
                    # eager draws op k with fold_in(key(seed), offset + k): the same here
                    key = jax.random.fold_in(base_key, offset + seeded[n])
                try:
                    out = info.call(info.normalize(args, kwargs), key, meta)
                except Exception as e:
                    e.add_note(f"torch_tpu compile: while lowering {n.format_node()}")
                    raise
                out = _cast_like(out, meta)
                if info.mutable:
                    self._mutate(n, info, out, env, write)
                env[n] = out
            elif op == "get_attr":
                env[n] = consts[n.name]
        outs = self.output_node.args[0]
        if isinstance(outs, torch.fx.Node):  # (a subgraph returning one value)
            return _lookup(outs, env)
        return [None if isinstance(a, torch.fx.Node) and a in host else _lookup(a, env)
                for a in outs]

    def _mutate(self, n, info, out, env, write):
        """An in-place op: the lowering returned the written arguments' new values. A
        graph input gets them written into its storage; any other node takes the new
        value (functionalization leaves no reader of the old one)."""
        news = out if len(info.mutable) > 1 else [out]
        for i, new in zip(info.mutable, news):
            arg = _arg(n, info, i)
            targets = _targets(arg)
            values = new if isinstance(arg, (list, tuple)) else [new]
            for target, value in zip(targets, values):
                env[target] = value
                if target.op == "placeholder":
                    write(self.ph_index[target], value)


class Subgraph:
    """A higher-order op's traced subgraph (flex_attention's score_mod and mask_mod) as a
    JAX function of its placeholders' values, interpreted through the lowering table;
    `dtypes`: its placeholders' JAX dtypes."""

    def __init__(self, gm):
        self.gm, self.graph = gm, None  # read when first used (a HOP may not use them all)

    def _ready(self):
        if self.graph is None:
            self.graph = GraphLowering(self.gm)
            self.consts = {k: (_runtime.to_device(v.detach().cpu().contiguous())
                               .reshape(tuple(v.shape)) if isinstance(v, torch.Tensor) else v)
                           for k, v in self.graph.consts.items()}
        return self.graph

    @property
    def dtypes(self):
        return [_runtime.jax_dtype(p.meta["val"].dtype)
                if isinstance(p.meta.get("val"), torch.Tensor) else jnp.int32
                for p in self._ready().placeholders]

    def __call__(self, *args):
        env = dict(zip(self._ready().placeholders, args))
        out = self.graph.trace(env, self.consts, 0, 0, lambda i, value: None)
        return out[0] if isinstance(out, (list, tuple)) else out


def _subgraphs(v):
    if isinstance(v, torch.fx.GraphModule):
        return Subgraph(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_subgraphs(x) for x in v)
    return v


def _whole_storage(node) -> bool:
    """Does this node's value fill its storage, contiguously from offset 0?"""
    meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(meta, torch.Tensor):
        return False
    try:
        return (meta.is_contiguous() and meta.storage_offset() == 0
                and meta.untyped_storage().nbytes() == meta.numel() * meta.element_size())
    except Exception:  # noqa: BLE001  (symbolic sizes: decline, the graph runs eagerly)
        return False


def _targets(arg):
    """The nodes a mutated argument names (a Tensor[] argument names several)."""
    if isinstance(arg, torch.fx.Node):
        return [arg]
    if isinstance(arg, (list, tuple)):
        return [a for a in arg if isinstance(a, torch.fx.Node)]
    return []


def _arg(n, info, i):
    if i < len(n.args):
        return n.args[i]
    return n.kwargs.get(info.names[i])


def _fetch_attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _lookup(a, env):
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_lookup(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _lookup(v, env) for k, v in a.items()}
    return a


def _cast_like(out, meta):
    """Cast results to torch's dtypes (and shapes) from node.meta["val"]."""
    if isinstance(meta, torch.Tensor):
        if not isinstance(out, jax.Array):
            if isinstance(out, (int, float, bool, complex)):
                out = jnp.asarray(out)
            else:
                return out
        dt = _runtime.jax_dtype(meta.dtype)
        if out.dtype != dt:
            out = out.astype(dt)
        shape = _concrete_shape(meta)
        if shape is not None and out.shape != shape:
            out = out.reshape(shape) if out.size == math.prod(shape) else jnp.broadcast_to(out, shape)
        return out
    if isinstance(meta, (list, tuple)) and isinstance(out, (list, tuple)):
        cast = [_cast_like(o, m) for o, m in zip(out, meta)]
        # (a named tuple, jax's SVDResult: built by field; torch.return_types from a list)
        return type(out)._make(cast) if hasattr(out, "_fields") else type(out)(cast)
    return out


def _concrete_shape(meta):
    """The meta shape, or None when it is symbolic (dynamic=True: sizes are known only at
    run time; int() on a SymInt would add a guard after the fact)."""
    shape = tuple(meta.shape)
    return shape if all(type(s) is int for s in shape) else None


