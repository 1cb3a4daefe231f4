"""The OpInfo sweep: every op of PyTorch's `op_db`, every sample, on tpu against CPU.

For each (op, dtype) the op's samples are generated on CPU; each runs on CPU (the
reference) and then, moved to tpu, in the chosen eager mode. Forward results are compared
(compare.py says how), then, for differentiable ops in floating dtypes, the gradients of
the inputs under one random cotangent. A pair passes when at least one sample runs on CPU
and every sample that does matches on tpu. Pairs that CPU itself does not support are
reported and never counted.
"""
from __future__ import annotations

import contextlib
import re
import signal
import time
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import compare, tolerances

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64,
          "bool": torch.bool}

# results that are uninitialized memory: only shapes and dtypes mean anything
UNINITIALIZED = {"resize_", "resize_as_"}


def op_db():
    # The package's only import of torch.testing._internal.
    from torch.testing._internal import common_methods_invocations as cmi

    from torch_tpu import _patches

    _patches.apply_for_validation()  # random ops unseeded: the sweep seeds each run
    return cmi.op_db


def op_name(opinfo) -> str:
    v = opinfo.variant_test_name
    return f"{opinfo.name}.{v}" if v else opinfo.name


def select(names=None) -> list:
    ops = op_db()
    if not names:
        return ops
    by_name = {op_name(o): o for o in ops}
    missing = [n for n in names if n not in by_name and not any(op_name(o).startswith(n + ".")
                                                                 for o in ops)]
    if missing:
        raise SystemExit(f"unknown op(s): {', '.join(missing)}")
    return [o for o in ops if op_name(o) in names or o.name in names]


# ---------------------------------------------------------------- moving samples
def _map(v, fn):
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, list):
        return [_map(x, fn) for x in v]
    if isinstance(v, tuple):
        return tuple(_map(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: _map(x, fn) for k, x in v.items()}
    return v


def _leaf(t: torch.Tensor, device: str, grad: bool) -> torch.Tensor:
    x = t.detach().to(device, copy=True)
    return x.requires_grad_(grad and t.requires_grad)


def _device_kwargs(kwargs: dict, device: str) -> dict:
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.device) or (k == "device" and isinstance(v, str)):
            v = torch.device(device) if torch.device(v).type == "cpu" else v
        out[k] = v
    return out


# op_db name -> positions in a sample's args of tensors the op takes on the host, whatever
# the device (tensor_split's indices, as on CUDA)
HOST_ARGS = {"tensor_split": {0}}


def place(sample, device: str, grad: bool = True, name: str = ""):
    """(input, args, kwargs, leaves) of `sample` as fresh leaves on `device`."""
    made = []

    def leaf(t):
        x = _leaf(t, device, grad)
        made.append(x)
        return x

    inp = _map(sample.input, leaf)
    host = HOST_ARGS.get(name, ())
    args = [a if i in host else _map(a, leaf) for i, a in enumerate(sample.args)]
    kwargs = _device_kwargs(_map(dict(sample.kwargs), leaf), device)
    return inp, args, kwargs, [x for x in made if x.requires_grad]


def _to_cpu(v):
    return _map(v, lambda t: t.detach().cpu())


# ---------------------------------------------------------------- errors
_MISSING = [re.compile(r"operator '(aten(?:::|\.)[\w.]+)' is not implemented for the tpu"),
            re.compile(r"no lowering for (aten(?:::|\.)[\w.]+)"),
            re.compile(r"Could not run '(aten(?:::|\.)[\w.]+)' with arguments from the "
                       r"'PrivateUse1'")]


_LAYOUT = re.compile(r"Could not run '(aten::[\w.]+)' with arguments from the "
                     r"'((?:Sparse|Mkldnn|Quantized)\w*)' backend")


def classify(exc: BaseException) -> dict:
    """{'kind', 'detail', 'aten'?} of an exception raised on tpu."""
    msg = str(exc)
    for pat in _MISSING:
        m = pat.search(msg)
        if m:
            name = m.group(1).replace("aten::", "aten.", 1)
            if name.count(".") == 1:
                name += ".default"  # the dotted OpOverload name, as str(op) writes it
            return {"kind": "missing_lowering", "aten": name, "detail": f"no lowering: {name}"}
    m = _LAYOUT.search(msg)
    if m:
        return {"kind": "unsupported_layout", "aten": m.group(1).replace("aten::", "aten."),
                "detail": f"{m.group(1)} has no kernel for the {m.group(2)} backend"}
    if isinstance(exc, _Timeout):
        return {"kind": "timeout", "detail": msg}
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    return {"kind": "error", "detail": f"{type(exc).__name__}: {first[:200]}"}


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str):
    """Raise _Timeout in the main thread after `seconds` (checked between Python bytecodes:
    a long XLA compile finishes first)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise _Timeout(f"{what} exceeded {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- one sample
class _SeededOps(TorchDispatchMode):
    """Notes whether the op reached an aten op that consumes the RNG (the
    `nondeterministic_seeded` tag): that makes its results random, to be judged on their
    statistics."""

    def __init__(self):
        super().__init__()
        self.seeded = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.seeded and torch.Tag.nondeterministic_seeded in func.tags:
            self.seeded = _draws(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


def _draws(func, args, kwargs) -> bool:
    """Whether a seeded op draws this time: attention kernels carry the tag for their
    dropout, and draw nothing at dropout_p 0 (every transformers model in eval mode); a
    dropout draws only in training."""
    schema = func._schema.arguments
    given = {a.name: a.default_value for a in schema if a.has_default_value()}
    given.update(zip((a.name for a in schema), args), **kwargs)
    if "dropout_p" in given:
        return float(given["dropout_p"] or 0.0) > 0.0
    if "train" in given and "p" in given:
        return bool(given["train"]) and float(given["p"]) > 0.0
    return True


def _run(fn, sample, device, seed, grad=True, watch=None, name=""):
    inp, args, kwargs, lv = place(sample, device, grad, name)
    torch.manual_seed(seed)
    with watch if watch is not None else contextlib.nullcontext():
        return fn(inp, *args, **kwargs), lv


def _grad_targets(opinfo, sample, out):
    out = sample.output_process_fn_grad(out) if sample.output_process_fn_grad else out
    return [t for t in compare.leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _cotangents(targets):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(t.shape, dtype=t.dtype, generator=g) for t in targets]


def _grads(targets, leaves, cots):
    got = torch.autograd.grad(targets, leaves, cots, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(got, leaves)]


def check_sample(opinfo, sample, dtype, mode, check_grad: bool, fn=None) -> dict:
    """{'status': 'pass' | 'fail' | 'cpu_error', ...} of one sample; `fn`: how tpu calls
    the op (default: as CPU does; the conformance harness passes a compiled one)."""
    import torch_tpu

    tpu_fn, fn, name = fn or opinfo.op, opinfo.op, opinfo.name
    watch = _SeededOps()
    try:
        ref, cpu_leaves = _run(fn, sample, "cpu", 0, watch=watch)
    except Exception:
        try:  # some samples run on CPU only without requires_grad
            ref, cpu_leaves = _run(fn, sample, "cpu", 0, grad=False, watch=watch)
        except Exception as e:
            return {"status": "cpu_error", "detail": f"{type(e).__name__}"}
    uninit = opinfo.has_nondeterministic_output or name in UNINITIALIZED
    random = not uninit and watch.seeded
    runs = [ref]
    if random:
        for seed in range(2, 1 + tolerances.RANDOM_SEEDS):  # (seed 0 is `ref`)
            runs.append(_run(fn, sample, "cpu", seed, grad=False)[0])
    grad = check_grad and bool(cpu_leaves) and not (random or uninit)
    try:
        with torch_tpu.eager_mode(mode):
            out, tpu_leaves = _run(tpu_fn, sample, "tpu", 0, grad=grad, name=name)
            got = _to_cpu(out)
    except _Timeout:
        raise
    except Exception as e:
        return {"status": "fail", **classify(e)}
    cpu_ref = _to_cpu(ref)
    if name in compare.SCRATCH:
        cpu_ref, got = (compare.without(x, compare.SCRATCH[name]) for x in (cpu_ref, got))
    same_indices = True
    if uninit:
        reason = compare.shapes_dtypes(cpu_ref, got)
    elif random:
        reason = compare.statistics_close([_to_cpu(r) for r in runs], got)
    elif name in compare.GAUGE:
        reason = compare.gauge_close(name, cpu_ref, got, dtype)
    elif name in compare.INDEXED:
        reason, same_indices = compare.indexed_close(name, sample, cpu_ref, got, dtype)
    else:
        reason = compare.values_close(cpu_ref, got, dtype)
        if reason and name not in compare.SCRATCH:
            reason = rounding_verdict(reason, fn, sample, dtype, cpu_ref, got)
    if reason:
        return {"status": "fail", "kind": "mismatch", "detail": reason}
    if not grad or not same_indices:  # tied indices route gradients elsewhere, validly
        return {"status": "pass", "grad": False}
    targets = _grad_targets(opinfo, sample, ref)
    if not targets:
        return {"status": "pass", "grad": False}
    cots = _cotangents(targets)
    try:
        want = _grads(targets, cpu_leaves, cots)
    except Exception:
        return {"status": "pass", "grad": False}  # no CPU derivative: nothing to compare
    try:
        with torch_tpu.eager_mode(mode):
            tt = _grad_targets(opinfo, sample, out)
            got_g = _to_cpu(_grads(tt, tpu_leaves, [c.to(t.device) for c, t in zip(cots, tt)]))
    except _Timeout:
        raise
    except Exception as e:
        c = classify(e)
        kind = "grad_missing_lowering" if c["kind"] == "missing_lowering" else "grad_error"
        return {"status": "fail", **c, "kind": kind, "detail": "grad: " + c["detail"]}
    reason = compare.values_close(_to_cpu(want), got_g, dtype, grad=True, what="grad")
    if reason and dtype in _LOW + _SINGLE:
        def wider_grads(r):
            out_w, leaves_w, sample_w = r
            t_w = _grad_targets(opinfo, sample_w, out_w)
            g_w = _grads(t_w, leaves_w, [c.to(t.dtype) for c, t in zip(cots, t_w)])
            if dtype in _LOW:
                return compare.values_close(_like(g_w, want), got_g, dtype, grad=True,
                                            what="grad")
            return compare.as_accurate(want, got_g, g_w, dtype, grad=True, what="grad")
        reason = _against_wider(reason, wider_grads, fn, sample,
                                _LOW if dtype in _LOW else _SINGLE)
    if reason:
        reason = _against_scalar_path(reason, fn, sample, cots, got_g, dtype)
    if reason:
        return {"status": "fail", "kind": "grad_mismatch", "detail": reason}
    return {"status": "pass", "grad": True}


SCALAR_PATH_MAX = 1 << 15  # elements a sample may have for that judge (one CPU call each)


def _against_scalar_path(reason, fn, sample, cots, got, dtype):
    """CPU's elementwise kernels run a vectorized loop over most of a tensor and a scalar
    loop over the rest (all of a tensor shorter than a vector), and for some ops the two
    disagree: the backward of hardtanh, relu6, softshrink, elu, selu and celu at a NaN
    input gives 0 or NaN in the vectorized loop, and passes the gradient through in the
    scalar loop, as CUDA does. So a gradient that misses CPU's passes when the sample is
    one elementwise tensor input (the other arguments numbers) and CPU's scalar loop, run
    on each element alone, gives it."""
    x = sample.input
    if (not isinstance(x, torch.Tensor) or not x.requires_grad or len(got) != 1
            or len(cots) != 1 or got[0].shape != x.shape or cots[0].shape != x.shape
            or x.numel() > SCALAR_PATH_MAX
            or any(isinstance(a, torch.Tensor) for a in (*sample.args, *sample.kwargs.values()))):
        return reason
    flat, cot = x.detach().reshape(-1), cots[0].reshape(-1)
    want = torch.empty_like(flat)
    try:
        for i in range(flat.numel()):
            xi = flat[i:i + 1].clone().requires_grad_(True)
            (g,) = torch.autograd.grad(fn(xi, *sample.args, **sample.kwargs), xi, cot[i:i + 1])
            want[i] = g[0]
    except Exception:  # noqa: BLE001  (not elementwise after all)
        return reason
    verdict = compare.values_close([want.reshape(x.shape)], got, dtype, grad=True, what="grad")
    return None if verdict is None else reason


# ---------------------------------------------------------------- rounding
_LOW = (torch.bfloat16, torch.float16)
_SINGLE = (torch.float32, torch.complex64)
_WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32,
          torch.float32: torch.float64, torch.complex64: torch.complex128}


def _upcast(sample, narrow):
    """`sample` with its tensors of the `narrow` dtypes one step wider (_WIDER)."""
    def up(t):
        if t.dtype in narrow:
            return t.detach().to(_WIDER[t.dtype]).requires_grad_(t.requires_grad)
        return t
    return types.SimpleNamespace(input=_map(sample.input, up), args=_map(list(sample.args), up),
                                 kwargs=_map(dict(sample.kwargs), up),
                                 output_process_fn_grad=sample.output_process_fn_grad)


def _like(values, refs) -> list:
    """`values` cast leaf by leaf to the dtypes of `refs`."""
    return [v.detach().to(r.dtype) if isinstance(v, torch.Tensor) and
            isinstance(r, torch.Tensor) else v for v, r in zip(values, refs)]


def rounding_verdict(reason, fn, sample, dtype, cpu_out, got):
    """`reason` (tpu's forward result `got` missed CPU's `cpu_out`), or None where the
    wider computation shows the miss is rounding (`_against_wider`)."""
    if dtype in _LOW:
        return _against_wider(reason, lambda r32: compare.values_close(
            _like(compare.leaves(r32[0]), compare.leaves(cpu_out)), compare.leaves(got),
            dtype), fn, sample, _LOW)
    if dtype in _SINGLE:
        return _against_wider(reason, lambda r64: compare.as_accurate(
            cpu_out, got, r64[0], dtype), fn, sample, _SINGLE)
    return reason


def _against_wider(reason, judge, fn, sample, narrow):
    """A result that misses CPU's may still be right where rounding decides:
    - bf16 / fp16: CPU rounds to 16 bits after every internal step, XLA keeps f32 inside a
      fused computation; accepted when it matches CPU's computation in f32, rounded at the
      end (`narrow` _LOW);
    - float32: a sum that cancels, a series' last terms; accepted when it is as close to
      CPU's float64 computation as CPU's own result is (`narrow` _SINGLE,
      compare.as_accurate).
    `judge` gets (the wider result, its leaves, the wider sample)."""
    try:
        wide = _upcast(sample, narrow)
        out, leaves = _run(fn, wide, "cpu", 0)
        verdict = judge((out, leaves, wide))
    except Exception:
        return reason
    return None if verdict is None else reason


# ---------------------------------------------------------------- one (op, dtype) pair
def check_pair(opinfo, dtype_name: str, mode: str, grad: bool = True,
               timeout: float | None = 300, max_samples: int | None = None) -> dict:
    """The verdict on one (op, dtype): status 'pass' | 'fail' | 'cpu_fail' | 'unsupported'.
    `max_samples` keeps the first samples only (the test suite's quick subset)."""
    dtype = DTYPES[dtype_name]
    if dtype not in opinfo.supported_dtypes("cpu"):
        return {"status": "unsupported"}
    t0 = time.perf_counter()
    check_grad = grad and opinfo.supports_autograd and dtype.is_floating_point
    res = {"status": "cpu_fail", "samples": 0, "cpu_ran": 0, "passed": 0, "failed": 0,
           "grad_checked": 0}
    first = None
    try:
        with time_limit(timeout, f"{op_name(opinfo)} {dtype_name}"):
            try:
                samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=check_grad))
                samples = samples[:max_samples] if max_samples else samples
            except Exception as e:
                return {**res, "detail": f"CPU sample generation: {type(e).__name__}"}
            res["samples"] = len(samples)
            for sample in samples:
                r = check_sample(opinfo, sample, dtype, mode, check_grad)
                if r["status"] == "cpu_error":
                    continue
                res["cpu_ran"] += 1
                if r["status"] == "pass":
                    res["passed"] += 1
                    res["grad_checked"] += bool(r.get("grad"))
                else:
                    res["failed"] += 1
                    first = first or r
    except _Timeout as e:
        res["failed"] += 1
        first = first or {"status": "fail", "kind": "timeout", "detail": str(e)}
    res["seconds"] = round(time.perf_counter() - t0, 2)
    if first is not None:
        res.update(first)
        res["status"] = "fail"
    elif res["cpu_ran"]:
        res["status"] = "pass"
    else:
        res["detail"] = "no sample runs on CPU"
    return res


def sweep(ops, dtypes, mode: str, grad: bool = True, timeout: float | None = 300,
          progress=None, on_result=None) -> dict:
    """op name -> dtype name -> verdict, for every op of `ops` in every dtype."""
    results: dict = {}
    for opinfo in ops:
        name = op_name(opinfo)
        for d in dtypes:
            if progress is not None:
                progress.set_postfix_str(f"{name} {d}", refresh=False)
            r = check_pair(opinfo, d, mode, grad, timeout)
            results.setdefault(name, {})[d] = r
            if on_result is not None:
                on_result(name, d, r)
            if progress is not None:
                progress.update(1)
    return results
