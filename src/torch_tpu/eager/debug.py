"""Debug eager mode: Strict plus waiting for every op and checking it.

Each op runs as in Strict, then waits for its result (`block_until_ready`), so an error
surfaces at the line that caused it. Then, per op:

- bounds: the index arguments a lowering declares (lowering/bounds.py: index, index_put,
  gather, scatter, embedding, index_select, take, nll_loss, ...) are read on the host
  *before* the op runs.
  XLA clamps or drops out-of-range indices silently; torch's CUDA raises a device-side
  assert. Debug raises `TpuIndexError` instead, naming the op, the value and the size.
- integer division by zero (`//`, `%`, fmod, div with a rounding mode): CPU raises
  `RuntimeError: ZeroDivisionError`, XLA returns -1 or the dividend; Debug reads the
  divisor and raises `TpuZeroDivisionError`, a RuntimeError with CPU's message.
- NaN: a floating result that holds NaN raises `TpuNonFiniteError`, unless an input
  already held NaN or Inf (then the op only propagated it: the producer is the op to name).
  `TORCH_TPU_DEBUG_NAN_CHECK=0` turns it off. An infinity raises too with
  `TORCH_TPU_DEBUG_INF_CHECK=1` (off by default, as JAX's `jax_debug_infs`): real models
  make -inf on purpose (T5's relative-position buckets take log(0), GPT-Neo adds two
  finfo.min masks), and a CUDA run never stops there.
- CPU shadow (`TORCH_TPU_DEBUG_CPU_CHECK=1`): the op runs again on CPU on the host values
  of its inputs; a result that differs beyond a per-dtype tolerance raises
  `TpuCpuMismatchError`.

Every error names the op and the user's line: the first stack frame outside torch and
torch_tpu (for an op that runs in backward, the line that called `backward()`). The flags
are read per op, so they can change while the mode is on. Metrics count the ops under
`dispatches.debug` and the checks under `debug.*` (nan_checks, bounds_checks, cpu_checks,
cpu_mismatches, cpu_check_skipped).
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import torch

from .. import _config, _runtime, _storage, _tolerances, _transfer, _tree, _waits, metrics
from .._frames import user_location
from ..lowering.registry import bounds_of
from ..op import refusals
from .strict import StrictExecutor


class TpuDebugError(RuntimeError):
    """An error found by a Debug mode check; the message names the op and the user's line."""


class TpuIndexError(TpuDebugError, IndexError):
    """An index outside its dimension (XLA would have clamped or dropped it silently)."""


class TpuNonFiniteError(TpuDebugError):
    """An op produced NaN or Inf from inputs that held none."""


class TpuCpuMismatchError(TpuDebugError):
    """An op's result differs from the same op run on CPU beyond tolerance."""


# ---------------------------------------------------------------- host values
_host = _transfer.host_value  # a debug read: not counted as a user sync


def _tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    return out


def _outputs(plan, vals, result):
    """The tpu tensors an op wrote: its results and its mutated arguments, each once."""
    ts = _tensors(result, [])
    for i in plan.mutable:
        _tensors(vals[i], ts)
    seen, out = set(), []
    for t in ts:
        if t.device.type == "tpu" and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _is_float(dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


# ---------------------------------------------------------------- bounds
def check_bounds(plan, vals) -> None:
    """Read each index argument on the host and raise on the first value out of range. The
    index arguments are those the lowering declares (lowering/bounds.py), the same ones
    Strict and DeferAndFuse check on the device (op/asserts.py)."""
    check = bounds_of(plan.lowering)
    if check is None:
        return
    for b in check(vals):
        if not isinstance(b.index, torch.Tensor) or b.index.numel() == 0:
            continue
        metrics.count("debug.bounds_checks")
        h = _host(b.index)
        bad = (h < (-b.size if b.negative_ok else 0)) | (h >= b.size)
        if b.ignore is not None:
            bad &= h != b.ignore
        if not bool(bad.any()):
            continue
        pos = tuple(bad.nonzero()[0].tolist())
        at = f" at position {list(pos)}" if pos else ""
        raise TpuIndexError(
            f"torch_tpu debug: {plan.name}: {b.noun} {int(h[pos])} is out of bounds for "
            f"{b.within} (argument '{b.arg}'{at}; XLA would clamp or drop it silently)"
            f"\n  at {user_location()}")


# ---------------------------------------------------------------- integer division
class TpuZeroDivisionError(TpuDebugError):
    """An integer division, remainder or fmod by zero (CPU raises "ZeroDivisionError")."""


# the ops that divide integers (an in-place op's `_` stripped); the divisor is argument 1
_DIVISIONS = {"aten::floor_divide", "aten::remainder", "aten::fmod", "aten::div"}


def check_divisors(plan, vals) -> None:
    """CPU's integer kernels raise on a zero divisor; XLA's integer division returns -1 and
    its remainder the dividend. Floating division is IEEE's (inf, nan), as on CPU."""
    name = plan.op._schema.name
    if name.rstrip("_") not in _DIVISIONS or len(vals) < 2:
        return
    if name.startswith("aten::div") and (
            "rounding_mode" not in plan.names or vals[plan.names.index("rounding_mode")] is None):
        return  # true division: a floating result
    dividend, divisor = vals[0], vals[1]
    computed = torch.result_type(dividend, divisor)
    if computed.is_floating_point or computed.is_complex:
        return
    if isinstance(divisor, torch.Tensor):
        if divisor.numel() == 0:
            return
        metrics.count("debug.zero_division_checks")
        zero = bool((_host(divisor) == 0).any())
    else:
        zero = divisor == 0
    if zero:
        raise TpuZeroDivisionError(
            f"ZeroDivisionError\n  torch_tpu debug: {plan.name}: integer division by zero "
            f"(XLA would return -1 or the dividend silently)\n  at {user_location()}")


# ---------------------------------------------------------------- NaN / Inf
@jax.jit
def _all_finite(flat):
    return jnp.isfinite(flat).all()


@jax.jit
def _no_nan(flat):
    return ~jnp.isnan(flat).any()


def _finite_storage(rec, dtype, clean=_all_finite) -> bool:
    """True when the whole storage is finite (`clean`: or holds no NaN): then so is every
    view of it. A storage viewed as another dtype (x.view(torch.int32)) says nothing;
    check the view instead."""
    buf, _, bdt = rec
    return bdt == _runtime.jax_dtype(dtype) and bool(clean(buf))


def _snapshot(vals):
    """Each floating input's buffer and view before the op (buffers are immutable, so a
    later in-place write does not change what this reads), and whether a number argument
    is already NaN or Inf."""
    tensors, numbers_finite = [], True
    for v in vals:
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, torch.Tensor):
                if _is_float(x.dtype):
                    rec = getattr(x.untyped_storage(), _storage.ATTR, None)
                    if x.device.type != "tpu" or rec is not None:
                        view = (tuple(x.shape), tuple(x.stride()), x.storage_offset())
                        tensors.append((x, rec) + view)
            elif isinstance(x, (float, complex)) and not _finite_number(x):
                numbers_finite = False
    return tensors, numbers_finite


def _finite_number(x) -> bool:
    parts = (x.real, x.imag) if isinstance(x, complex) else (x,)
    return all(v == v and abs(v) != float("inf") for v in parts)


def _inputs_finite(snapshot) -> bool:
    tensors, numbers_finite = snapshot
    if not numbers_finite:
        return False
    for t, rec, shape, stride, offset in tensors:
        if rec is None:  # a CPU 0-dim tensor beside tpu ones
            if not bool(torch.isfinite(t).all()):
                return False
            continue
        buf, n, bdt = rec
        if buf.is_deleted() or _finite_storage(rec, t.dtype):
            continue
        # the storage holds NaN/Inf somewhere: look at this view only
        view = _transfer.materializer(shape, stride, offset, n, bdt, t.dtype)(buf)
        if not bool(_all_finite(view.reshape(-1))):
            return False
    return True


def _nonfinite_message(t) -> str:
    h = _host(t)
    nan = torch.isnan(h)
    inf = torch.isinf(h)
    first = tuple((nan | inf).nonzero()[0].tolist())
    kind = "NaN" if bool(nan.any()) else "Inf"
    return (f"{kind} ({int(nan.sum())} NaN, {int(inf.sum())} Inf of {h.numel()} elements; "
            f"first at index {list(first)}: {h[first].item()})")


# results that hold -inf by design: ctc_loss's log_alpha marks unreachable states with it
_MAY_BE_INFINITE = {"aten::_ctc_loss": {1}}


def check_finite(plan, outs, snapshot, infs: bool = False) -> None:
    """A NaN in a floating result (with `infs`, also an Inf) made from inputs with neither
    raises TpuNonFiniteError."""
    allowed = _MAY_BE_INFINITE.get(plan.op._schema.name, ())
    clean = _all_finite if infs else _no_nan
    for k, t in enumerate(outs):
        if not _is_float(t.dtype) or (infs and k in allowed):
            continue
        metrics.count("debug.nan_checks")
        rec = _storage.record(t.untyped_storage(), t.dtype)
        if _finite_storage(rec, t.dtype, clean) or \
                bool(clean(_transfer.materialize(t).reshape(-1))):
            continue
        if not _inputs_finite(snapshot):
            return  # propagated: the op that made the first NaN/Inf was already named
        which = f"result {k}" if len(outs) > 1 else "its result"
        raise TpuNonFiniteError(
            f"torch_tpu debug: {plan.name} produced {_nonfinite_message(t)} in {which}, "
            f"from inputs with no NaN or Inf\n  at {user_location()}")


# ---------------------------------------------------------------- CPU shadow
# ops the CPU check cannot rerun faithfully, with why
_NO_SHADOW = {
    # reads the forward's scratch buffer, whose content is each kernel's own business
    "aten::log_sigmoid_backward",
}


def _shadowable(plan) -> bool:
    # seeded ops draw from a different generator on CPU; empty* results are uninitialized
    name = plan.op._schema.name
    return not plan.seeded and "empty" not in name and name not in _NO_SHADOW


# results the CPU check does not compare (op -> result indices), because more than one
# answer is right:
_UNCOMPARED = {name: {1} for name in (
    # positions of values that may tie: XLA and torch may pick different ones
    "aten::sort", "aten::topk", "aten::kthvalue", "aten::mode", "aten::median",
    "aten::nanmedian", "aten::max", "aten::min", "aten::cummax", "aten::cummin",
    "aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices",
    "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
    # eigenvectors: each is unique only up to sign
    "aten::_linalg_eigh",
    # a scratch buffer for backward whose content is the kernel's own business
    "aten::log_sigmoid_forward")}
_UNCOMPARED.update({name: {0} for name in ("aten::argmax", "aten::argmin", "aten::argsort")})
_UNCOMPARED["aten::_linalg_svd"] = {0, 2}  # singular vectors: unique up to sign
# save_mean/save_invstd, unused in eval: torch's meta kernel sizes them (C,), its CPU
# kernel returns them empty
_UNCOMPARED["aten::_native_batch_norm_legit_no_training"] = {1, 2}


def _cpu_args(vals):
    return [_cpu_value(v) for v in vals]


def _cpu_value(v):
    # every tensor cloned: the CPU op must not write into the user's host tensors
    return _tree.convert(v, lambda t: _host(t).clone(), _CPU)


_CPU = torch.device("cpu")


def _mismatch(got: torch.Tensor, want: torch.Tensor):
    """None when `got` (a tpu result on the host) matches `want` (CPU), else why not."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, CPU gives {tuple(want.shape)}"
    if got.dtype != want.dtype:
        if not (_is_float(got.dtype) and _is_float(want.dtype)):
            return f"dtype {got.dtype}, CPU gives {want.dtype}"
        # results take torch's meta dtypes, and torch's CPU kernels sometimes differ
        # (native_layer_norm's bf16 mean/rstd are float32 on meta and CUDA, bf16 on CPU):
        # compare the values at the CPU's precision
        got = got.to(want.dtype)
    if got.numel() == 0:
        return None
    # the table the validation sweeps use; atol scales with the result's largest magnitude
    tol = _tolerances.BY_DTYPE.get(want.dtype)
    if tol is None:  # integers and bool: exact
        bad = got != want
    else:
        rtol, atol = tol
        finite = want[torch.isfinite(want)]
        scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
        bad = ~torch.isclose(got, want, rtol=rtol, atol=atol * scale, equal_nan=True)
    if not bool(bad.any()):
        return None
    pos = tuple(bad.nonzero()[0].tolist())
    diff = (got - want).abs() if want.is_complex() else (got.double() - want.double()).abs()
    diff = diff[bad].nan_to_num(nan=float("inf"))  # NaN against a number counts as infinite
    tol_s = "exact" if tol is None else f"rtol={tol[0]}, atol={tol[1]}"
    return (f"{int(bad.sum())} of {got.numel()} elements differ ({tol_s}); max abs diff "
            f"{float(diff.max())}; first at index {list(pos)}: tpu {got[pos].item()} vs cpu "
            f"{want[pos].item()}")


_WARNED: set = set()


def check_cpu(plan, vals, result, cargs) -> None:
    metrics.count("debug.cpu_checks")
    kw = {plan.names[i]: cargs[i] for i in range(plan.npos, len(cargs))}
    try:
        expected = plan.op(*cargs[:plan.npos], **kw)
    except Exception as e:  # noqa: BLE001
        # CPU lacks a kernel (a dtype, an option): no evidence against the lowering
        metrics.count("debug.cpu_check_skipped")
        name = plan.name
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"torch_tpu debug: the CPU check skips {name}, which fails on CPU: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    pairs = list(zip(_tensors(result, []), _tensors(expected, [])))
    for i in plan.mutable:
        pairs.extend(zip(_tensors(vals[i], []), _tensors(cargs[i], [])))
    skip = _UNCOMPARED.get(plan.op._schema.name, ())
    for k, (got, want) in enumerate(pairs):
        if k in skip:
            continue
        why = _mismatch(_host(got), want)
        if why is not None:
            metrics.count("debug.cpu_mismatches")
            raise TpuCpuMismatchError(
                f"torch_tpu debug: {plan.name} differs from CPU in result {k}: {why}"
                f"\n  at {user_location()}")
    got_s, want_s = _numbers(result, []), _numbers(expected, [])
    if got_s != want_s:  # bool/int results (aten::equal, aten::is_nonzero, ...)
        raise TpuCpuMismatchError(
            f"torch_tpu debug: {plan.name} returns {got_s}, CPU returns {want_s}"
            f"\n  at {user_location()}")


def _numbers(x, out):
    if isinstance(x, (bool, int)):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _numbers(y, out)
    return out


# ---------------------------------------------------------------- the executor
class DebugExecutor(StrictExecutor):
    """Strict, but every op waits for its result and is checked (see the module doc)."""

    name = "debug"
    counter = "dispatches.debug"
    write_in_place = None  # (each write runs as its op, with its checks)

    def execute(self, plan, vals):
        refusals.check_call(plan, vals)  # torch's refusal of a bad dim before the bounds read it
        check_bounds(plan, vals)
        check_divisors(plan, vals)
        nan_check = _config.get("TORCH_TPU_DEBUG_NAN_CHECK")
        snapshot = _snapshot(vals) if nan_check else None
        shadow = _config.get("TORCH_TPU_DEBUG_CPU_CHECK") and _shadowable(plan)
        cargs = _cpu_args(vals) if shadow else None
        try:
            result = super().execute(plan, vals)
            outs = _outputs(plan, vals, result)
            _waits.begin(plan.name)
            try:
                jax.block_until_ready([_storage.record(t.untyped_storage(), t.dtype)[0]
                                       for t in outs])
            finally:
                _waits.end()
        except Exception as e:
            if not isinstance(e, TpuDebugError):
                e.add_note(f"torch_tpu debug: raised by {plan.name} at {user_location()}")
            raise
        if nan_check:
            check_finite(plan, outs, snapshot, _config.get("TORCH_TPU_DEBUG_INF_CHECK"))
        if cargs is not None:
            check_cpu(plan, vals, result, cargs)
        return result

    def fill(self, storage, dtype, value) -> None:
        """fill_/zero_ of a whole storage (torch.zeros/ones/full): waits like every op, so
        an error surfaces here, and counts as a checked op (a shared constant too)."""
        metrics.counters[self.counter] += 1
        try:
            self.constant(storage, dtype, value)
            jax.block_until_ready(_storage.record(storage, dtype)[0])
        except Exception as e:
            e.add_note(f"torch_tpu debug: raised by aten::fill_ at {user_location()}")
            raise
