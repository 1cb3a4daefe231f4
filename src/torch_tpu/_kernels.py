"""Custom kernels: `jax_op` makes a JAX function, or a Pallas kernel, a torch operator.

`torch_tpu.jax_op("mylib::rms_norm", fn, static_argnames=("eps",))` defines the custom op
`torch.ops.mylib.rms_norm` with `torch.library.custom_op` and returns it: a CustomOpDef,
callable, with `register_fake` / `register_autograd` / `register_kernel` like any custom op.
The reference system spells it `torch_tpu._internal.pallas.jax_op(name, fn)`; both names
are this function.

- Schema: read from `fn`'s signature. Every parameter is a tensor (a list/Sequence
  annotation: a tensor list; a None default: an optional tensor), except those named in
  `static_argnames`: constants of the program (int, float, bool, str, or a list of ints or
  floats, typed by annotation or by default value), part of the cache key. The results come
  from the return annotation: an array, a `tuple` of N arrays, or a list of arrays
  (`Tensor[]`); without one, one array.
- tpu: `fn` is the op's lowering in the one lowering table (lowering/registry.py), and the op
  gets the same C kernel as a lowered aten op. So every executor and the compile backend
  treat it like an aten op: Strict runs it as its own cached program, Debug adds its checks,
  DeferAndFuse records it as a node of the pending graph (fused with its neighbours, not a
  flush), and `torch.compile` lowers it as one node of the graph's program.
- Fake/meta: `jax.eval_shape` of `fn` on the inputs' shapes and dtypes (cached per
  signature): what FakeTensor, dynamo and the eager executors' meta step see. Input that
  `fn` rejects raises here, before anything runs, naming the op.
- CPU: `fn` run by JAX on the host CPU, so the op works on CPU tensors too (references,
  Debug's CPU check).
- Backward: `op.register_autograd(backward, setup_context=...)` (or
  `torch.library.register_autograd`), whose backward may call further jax_ops. Until one is
  registered, the op differentiates with `jax.vjp` of `fn`, run as a second op
  `<name>_vjp` (a jax_op itself, defined at the first backward: it also fuses and compiles). A Pallas kernel usually has no
  JAX derivative: register its backward.

The op never writes its inputs (no `mutates_args`): results are new tensors.
"""
from __future__ import annotations

import collections.abc
import functools
import inspect
import typing

import jax
import torch

from . import _dispatch, _runtime
from .lowering import registry

_STATIC_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}
_STATIC_NAMES = {"int": "int", "float": "float", "bool": "bool", "str": "str",
                 "list[int]": "int[]", "list[float]": "float[]"}
_SEQUENCES = (list, tuple, collections.abc.Sequence)


class _Param(typing.NamedTuple):
    name: str
    schema: str          # the schema's type ("Tensor", "Tensor?", "Tensor[]", "float", ...)
    static: bool
    default: object      # inspect.Parameter.empty when it has none


def jax_op(name: str, fn=None, *, static_argnames=()):
    """Register `fn` (a JAX function or a Pallas kernel) as the torch custom op `name`
    ("namespace::op"); see the module docstring. Returns the op (a CustomOpDef). Without
    `fn`, a decorator."""
    if fn is None:
        return lambda f: jax_op(name, f, static_argnames=static_argnames)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    params = _params(name, fn, tuple(static_argnames))
    returns = _returns(fn)
    op = _JaxOp(name, fn, params, returns)
    if all(p.static or p.schema == "Tensor" for p in params) and returns[1] is not None:
        _register_vjp(op)
    return op.opdef


# ---------------------------------------------------------------- the schema
def _hints(fn) -> dict:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001  (unresolvable annotations: read them as written)
        target = getattr(fn, "__wrapped__", fn)
        return dict(getattr(target, "__annotations__", {}) or {})


def _params(name, fn, static_argnames) -> list:
    sig = inspect.signature(fn)
    hints = _hints(fn)
    unknown = set(static_argnames) - set(sig.parameters)
    if unknown:
        raise TypeError(f"jax_op {name}: static_argnames {sorted(unknown)} are not parameters "
                        f"of {_fn_name(fn)}{sig}")
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"jax_op {name}: {_fn_name(fn)} takes *{p.name}; a torch op needs "
                            "named parameters")
        hint = hints.get(p.name, p.annotation)
        if p.name in static_argnames:
            params.append(_Param(p.name, _static_type(name, p, hint), True, p.default))
        elif p.default is None:
            params.append(_Param(p.name, "Tensor?", False, None))
        elif _is_sequence(hint):
            params.append(_Param(p.name, "Tensor[]", False, p.empty))
        else:
            params.append(_Param(p.name, "Tensor", False, p.empty))
    if not any(not p.static for p in params):
        raise TypeError(f"jax_op {name}: {_fn_name(fn)} takes no array argument")
    return params


def _static_type(name, p, hint) -> str:
    if hint in _STATIC_TYPES:
        return _STATIC_TYPES[hint]
    text = hint if isinstance(hint, str) else str(hint).replace("typing.", "").lower()
    if text in _STATIC_NAMES:
        return _STATIC_NAMES[text]
    if p.default is not p.empty and type(p.default) in _STATIC_TYPES:
        return _STATIC_TYPES[type(p.default)]
    if isinstance(p.default, (list, tuple)) and p.default:
        kind = {type(v) for v in p.default}
        if kind <= {int}:
            return "int[]"
        if kind <= {int, float}:
            return "float[]"
    raise TypeError(f"jax_op {name}: static argument {p.name!r} needs a type: annotate it "
                    "(int, float, bool, str, list[int], list[float]) or give it a default")


def _is_sequence(hint) -> bool:
    origin = typing.get_origin(hint) or hint
    return isinstance(origin, type) and issubclass(origin, _SEQUENCES) or origin in _SEQUENCES


def _returns(fn):
    """-> (schema returns, number of results or None for a tensor list)."""
    hint = _hints(fn).get("return", inspect.Signature.empty)
    origin = typing.get_origin(hint) or hint
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 1:
            return "Tensor", 1  # a 1-tuple: its array (unwrapped by _JaxOp._one)
        if args and args[-1] is not Ellipsis:
            return "(" + ", ".join(["Tensor"] * len(args)) + ")", len(args)
        return "Tensor[]", None
    if _is_sequence(hint):
        return "Tensor[]", None
    return "Tensor", 1


def _default(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_default(x) for x in v) + "]"
    return repr(v)


def _schema(params, returns) -> str:
    parts = []
    for p in params:
        s = f"{p.schema} {p.name}"
        if p.default is not inspect.Parameter.empty:
            s += "=" + ("None" if p.default is None else _default(p.default))
        parts.append(s)
    return "(" + ", ".join(parts) + ") -> " + returns


def _fn_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


# ---------------------------------------------------------------- the op
class _JaxOp:
    """One jax_op: its custom op, its lowering, and its fake and CPU implementations."""

    def __init__(self, name, fn, params, returns):
        self.name = name
        self.fn = fn
        self.params = params
        self.names = tuple(p.name for p in params)
        self.returns, self.nrets = returns
        self.shapes: dict = {}   # input signature -> fn's jax.eval_shape result
        self.cpu_jits: dict = {}  # static values -> fn jitted for the host
        self.opdef = torch.library.custom_op(
            name, self._cpu, mutates_args=(), device_types="cpu",
            schema=_schema(params, self.returns))
        self.opdef.register_fake(self._fake)
        overload = self.opdef._opoverload
        registry.lowering(overload)(self._lowering)
        _dispatch.register_op(overload)

    def _bind(self, args, kwargs) -> dict:
        vals = dict(zip(self.names, args))
        vals.update(kwargs)
        for p in self.params:
            if p.name not in vals:
                vals[p.name] = None if p.default is inspect.Parameter.empty else p.default
        return vals

    def _split(self, vals):
        """-> (the arrays' parameter names, their values, the static values)."""
        names = [p.name for p in self.params if not p.static]
        statics = {p.name: _hashable(vals[p.name]) for p in self.params if p.static}
        return names, [vals[n] for n in names], statics

    def _call(self, names, arrays, statics):
        kwargs = dict(zip(names, arrays))
        kwargs.update(statics)
        return self.fn(**kwargs)

    # ------------------------------------------------------------ tpu: the lowering
    def _lowering(self, *args, **kwargs):
        names, arrays, statics = self._split(self._bind(args, kwargs))
        try:
            out = self._call(names, arrays, statics)
        except Exception as e:
            e.add_note(f"torch_tpu.jax_op: raised by {self.name} ({_fn_name(self.fn)})")
            raise
        return list(out) if self.nrets is None else self._one(out)

    def _one(self, out):
        """A single result returned as a 1-tuple or 1-list: the array."""
        if self.nrets == 1 and isinstance(out, (tuple, list)) and len(out) == 1:
            return out[0]
        return out

    # ------------------------------------------------------------ fake / meta
    def _fake(self, *args, **kwargs):
        names, tensors, statics = self._split(self._bind(args, kwargs))
        device = next((t.device for t in _leaves(tensors)), torch.device("meta"))
        key = (tuple(_signature(t) for t in tensors), tuple(statics.items()))
        out = self.shapes.get(key)
        if out is None:
            structs = [_struct(t) for t in tensors]
            try:
                out = jax.eval_shape(lambda *a: self._call(names, a, statics), *structs)
            except Exception as e:
                raise RuntimeError(
                    f"{self.name}: {_fn_name(self.fn)} rejects its inputs "
                    f"({_describe(names, tensors, statics)}): {type(e).__name__}: {e}") from e
            self._check_results(out)
            out = self.shapes[key] = self._one(out)
        if self.nrets is None:
            return [_empty(s, device) for s in out]
        if self.nrets == 1:
            return _empty(out, device)
        return tuple(_empty(s, device) for s in out)

    def _check_results(self, out) -> None:
        # RuntimeError, not TypeError: the eager meta step reads a TypeError from a meta
        # kernel as "no meta kernel" (op/meta.py run) and would carry on
        many = isinstance(out, (tuple, list))
        leaves = list(out) if many else [out]
        if not all(isinstance(s, jax.ShapeDtypeStruct) for s in leaves):
            raise RuntimeError(f"{self.name}: {_fn_name(self.fn)} returns {out}; a jax_op "
                               "returns an array, a tuple of arrays or a list of arrays")
        if self.nrets is not None and len(leaves) != self.nrets:
            raise RuntimeError(
                f"{self.name}: {_fn_name(self.fn)} returns {len(leaves)} array(s) but its "
                f"signature declares {self.returns}; annotate its return (`-> tuple[jax.Array, "
                f"jax.Array]` for two, `-> list[jax.Array]` for a list)")

    # ------------------------------------------------------------ CPU
    def _cpu(self, *args, **kwargs):
        names, tensors, statics = self._split(self._bind(args, kwargs))
        jitted = self.cpu_jits.get(tuple(statics.items()))
        if jitted is None:
            jitted = jax.jit(lambda *a: self._call(names, a, statics))
            self.cpu_jits[tuple(statics.items())] = jitted
        cpu = jax.devices("cpu")[0]
        with jax.default_device(cpu):
            out = jitted(*[_tree(t, lambda x: jax.device_put(_host(x), cpu)) for t in tensors])
        if self.nrets is None:
            return [_torch(o) for o in out]
        out = self._one(out)
        return _torch(out) if self.nrets == 1 else tuple(_torch(o) for o in out)


def _hashable(v):
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def _tree(v, f):
    if isinstance(v, torch.Tensor):
        return f(v)
    if isinstance(v, (list, tuple)):
        return [_tree(x, f) for x in v]
    return v


def _leaves(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _leaves(v)


def _concrete(shape) -> tuple:
    # jax.eval_shape needs sizes; a symbolic size (dynamic=True) is specialized to its value
    return tuple(int(s) for s in shape)


def _signature(t):
    if isinstance(t, torch.Tensor):
        return _concrete(t.shape), t.dtype
    if isinstance(t, (list, tuple)):
        return tuple(_signature(x) for x in t)
    return t


def _struct(t):
    return _tree(t, lambda x: jax.ShapeDtypeStruct(_concrete(x.shape), _runtime.jax_dtype(x.dtype)))


def _describe(names, tensors, statics) -> str:
    def one(t):
        if isinstance(t, torch.Tensor):
            return f"{str(t.dtype).replace('torch.', '')}{list(_concrete(t.shape))}"
        if isinstance(t, (list, tuple)):
            return "[" + ", ".join(one(x) for x in t) + "]"
        return repr(t)
    parts = [f"{n}: {one(t)}" for n, t in zip(names, tensors)]
    parts += [f"{n}={v!r}" for n, v in statics.items()]
    return ", ".join(parts)


def _empty(s, device):
    return torch.empty(s.shape, dtype=_runtime.torch_dtype(s.dtype), device=device)


def _host(t: torch.Tensor):
    return _runtime.host_array(t.contiguous()).reshape(tuple(t.shape))


def _torch(a) -> torch.Tensor:
    dtype = _runtime.torch_dtype(a.dtype)
    return _runtime.to_host(a, dtype).reshape(a.shape)


# ---------------------------------------------------------------- the derived backward
def _register_vjp(op: _JaxOp) -> None:
    """op's backward from jax.vjp of its function, as the op `<name>_vjp`: (the arrays, one
    cotangent per result, the statics) -> one gradient per array (zeros for an array that
    is not floating: torch gets None for it)."""
    arrays = [p for p in op.params if not p.static]
    statics = [p for p in op.params if p.static]
    cot_names = [f"grad_{i}" for i in range(op.nrets)]
    taken = {p.name for p in op.params}
    cot_names = [n if n not in taken else f"_{n}" for n in cot_names]
    fn, names = op.fn, [p.name for p in arrays]

    def vjp_fn(**kw):
        xs = [kw[n] for n in names]
        cts = [kw[n] for n in cot_names]
        st = {p.name: kw[p.name] for p in statics}
        diff = [i for i, x in enumerate(xs) if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)]

        def f(*d):
            args = list(xs)
            for i, v in zip(diff, d):
                args[i] = v
            outs = fn(**dict(zip(names, args)), **st)
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            return tuple(o for o in outs if jax.numpy.issubdtype(o.dtype, jax.numpy.inexact))

        outs, pullback = jax.vjp(f, *[xs[i] for i in diff])
        floats = [c for c in cts if jax.numpy.issubdtype(c.dtype, jax.numpy.inexact)]
        grads = pullback(tuple(c.astype(o.dtype) for c, o in zip(floats, outs)))
        result = [jax.numpy.zeros(x.shape, x.dtype) for x in xs]
        for i, g in zip(diff, grads):
            result[i] = g
        return tuple(result) if len(result) > 1 else result[0]

    params = ([_Param(p.name, "Tensor", False, p.default) for p in arrays]
              + [_Param(n, "Tensor", False, inspect.Parameter.empty) for n in cot_names]
              + statics)
    returns = ("(" + ", ".join(["Tensor"] * len(arrays)) + ")", len(arrays)) if len(arrays) > 1 \
        else ("Tensor", 1)

    @functools.cache
    def vjp_op():  # defined at the first backward: most ops with a kernel register their own
        return _JaxOp(op.name + "_vjp", _named(vjp_fn, op.fn, [p.name for p in params]), params,
                      returns).opdef

    array_at = [i for i, p in enumerate(op.params) if not p.static]
    static_at = [i for i, p in enumerate(op.params) if p.static]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[inputs[i] for i in array_at])
        ctx.statics = [inputs[i] for i in static_at]

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        try:
            gs = vjp_op()(*saved, *grads, *ctx.statics)
        except Exception as e:
            e.add_note(f"torch_tpu.jax_op: {op.name} has no backward of its own and jax.vjp of "
                       f"{_fn_name(op.fn)} failed; register one with "
                       f"{op.name.split('::')[-1]}.register_autograd(...)")
            raise
        gs = gs if isinstance(gs, (tuple, list)) else (gs,)
        out = [None] * len(op.params)
        for i, t, g in zip(array_at, saved, gs):
            out[i] = g if (t.dtype.is_floating_point or t.dtype.is_complex) else None
        return tuple(out)

    op.opdef.register_autograd(backward, setup_context=setup_context)


def _named(vjp_fn, fn, names):
    """vjp_fn as a function of the VJP op's parameters, by name (its schema's order)."""
    def call(*args, **kwargs):
        kw = dict(zip(names, args))
        kw.update(kwargs)
        return vjp_fn(**kw)
    call.__qualname__ = f"jax.vjp({_fn_name(fn)})"
    return call


__all__ = ["jax_op"]
