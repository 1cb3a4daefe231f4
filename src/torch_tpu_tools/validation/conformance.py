"""PyTorch's device-generic op checks on tpu: families of checks over the OpInfo database,
in Strict, DeferAndFuse and compiled (`torch.compile(backend="tpu")`).

Each family asks what torch's own device-generic tests ask of a device (test/test_ops.py),
written here from scratch and judged against CPU wherever the answer is CPU's behaviour:

- compare: every `reference_inputs` sample (the first `MAX_SAMPLES`) against CPU, forward
  and gradients (ops.check_sample judges);
- out: an op's out= variant with a right out, a non-contiguous one (strides kept), one of
  another shape and an empty one (resized), one of another dtype (CPU's verdict), and one
  on CPU (refused); the op returns the out tensor itself;
- out_warning: a non-empty out of another shape warns (torch's rule), a right one never;
- errors: every `error_inputs` case raises its type with a message matching its pattern, at
  the call (DeferAndFuse too: a later sync must not be where it surfaces);
- noncontiguous: non-contiguous samples give the contiguous samples' results and grads;
- variants: method, in-place and operator variants agree with the function (CPU decides
  whether a variant may refuse a sample);
- dtypes: in each dtype CPU runs, tpu is right or refuses with a clear error, never wrong.

`check(family, opinfo, mode)` is one verdict: {'status': 'pass' | 'fail' | 'na' |
'cpu_fail' | 'declared', 'detail'}; 'declared' is a check PyTorch's own OpInfo skips or
expects to fail on every device (`declared`), left out of the counts as torch's suite
would. The sweep (`python -m torch_tpu validate conformance`) runs every op;
tests/ops/test_conformance.py runs a sample through torch's device-type machinery.
"""
from __future__ import annotations

import contextlib
import re
import types
import unittest
import warnings

import torch

from torch_tpu import RecompileWarning

from . import compare, ops

FAMILIES = ("compare", "out", "out_warning", "errors", "noncontiguous", "variants", "dtypes")
MODES = ("strict", "defer_and_fuse", "compiled")
MAX_SAMPLES = 16  # reference_inputs per op in `compare` (some ops have hundreds)
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
          torch.int32, torch.bool, torch.complex64)
RESIZED = "resized"  # torch's warning, and arange's own
# `--sample`: 66 ops common in real models, every family represented (pointwise with out=,
# reductions, matmuls, indexing with error inputs, shape ops, factories, random, losses,
# nn functional), for the single-process run per mode (`--single-process`)
SAMPLE = ("add", "sub", "mul", "div.no_rounding_mode", "pow", "exp", "log", "sqrt", "rsqrt",
          "tanh", "sigmoid", "abs", "neg", "where", "clamp", "maximum", "sum", "mean", "amax",
          "std", "var", "prod", "cumsum", "argmax", "topk", "sort", "mm", "bmm", "addmm",
          "matmul", "baddbmm", "cat", "stack", "index_select", "gather", "scatter",
          "index_add", "masked_fill", "masked_select", "nonzero", "transpose", "reshape",
          "expand", "split", "chunk", "tril", "triu", "flip", "roll", "arange", "full",
          "zeros_like", "linspace", "softmax", "log_softmax", "nn.functional.dropout",
          "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.silu",
          "nn.functional.linear", "nn.functional.embedding", "nn.functional.cross_entropy",
          "nn.functional.mse_loss", "nn.functional.conv2d",
          "nn.functional.scaled_dot_product_attention", "nn.functional.pad.constant")


# the test of torch's test/test_ops.py (class TestCommon) each family asks what it asks
TORCH_TESTS = {"compare": "test_compare_cpu", "out": "test_out",
               "out_warning": "test_out_warning", "errors": "test_errors",
               "noncontiguous": "test_noncontiguous_samples",
               "variants": "test_variant_consistency_eager", "dtypes": "test_dtypes"}
_DEVICE_TYPES = ("privateuse1", "tpu")  # what torch's machinery calls this device


def declared(family: str, opinfo) -> str | None:
    """Why PyTorch itself does not ask this family's test of this op on tpu, or None: the
    OpInfo marks that TestCommon test `unittest.skip` or `expectedFailure` on every device
    (or on privateuse1), so torch's own suite, run for tpu, would not count it. Such checks
    are left out of the conformance counts, and listed as PyTorch's."""
    test = TORCH_TESTS[family]
    # torch runs test_dtypes and test_errors once per op, the others in one dtype
    try:
        dtype = None if family in ("dtypes", "errors") else _dtype_of(opinfo)
    except NotApplicable:
        return None
    for info in opinfo.decorators:
        if not hasattr(info, "is_active"):  # a plain decorator: on every test of the op
            decorators = [info]
        elif any(info.is_active("TestCommon", test, dev, dtype, {}) for dev in _DEVICE_TYPES):
            decorators = info.decorators
        else:
            continue
        for d in decorators:
            if d is unittest.expectedFailure:
                return f"PyTorch's OpInfo marks {test} an expected failure on every device"
            if getattr(d, "__qualname__", "") == "skip.<locals>.decorator":
                return f"PyTorch's OpInfo skips {test} on every device"
    return None


class Failed(Exception):
    """One family's verdict against tpu, with the reason."""


class NotApplicable(Exception):
    """The op has nothing this family checks (no out= variant, no error inputs)."""


# ---------------------------------------------------------------- modes
@contextlib.contextmanager
def in_mode(mode: str):
    import torch_tpu

    with torch_tpu.eager_mode("strict" if mode == "compiled" else mode):
        yield
        torch.tpu.synchronize()


def runner(fn, mode: str, device: str = "tpu"):
    """`fn` as this mode calls it on `device`. Compiled mode wraps it in torch.compile, with
    backend tpu on tpu and aot_eager on CPU: what a compiled call may refuse (dynamo's
    own limits with out= resizes, say) is decided by CPU under dynamo too. Static shapes,
    a fresh cache per family (see run())."""
    if mode != "compiled":
        return fn

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    return torch.compile(call, backend="tpu" if device == "tpu" else "aot_eager", dynamic=False)


def _dtype_of(opinfo) -> torch.dtype:
    cpu = opinfo.supported_dtypes("cpu")
    if torch.float32 in cpu:
        return torch.float32
    for d in DTYPES:
        if d in cpu:
            return d
    raise NotApplicable("no dtype of this harness runs on CPU")


def _tensors(out) -> list:
    return [t for t in compare.leaves(out) if isinstance(t, torch.Tensor)]


def _samples(opinfo, dtype, n=None, grad=False, reference=False):
    make = opinfo.reference_inputs if reference else opinfo.sample_inputs
    samples = []
    for s in make("cpu", dtype, requires_grad=grad):
        samples.append(s)
        if n is not None and len(samples) >= n:
            break
    return samples


def _on(sample, device, opinfo):
    """The sample on `device`, but for the arguments the op takes on the host everywhere
    (tensor_split's indices, ops.HOST_ARGS)."""
    inp, args, kwargs, _ = ops.place(sample, device, grad=False, name=opinfo.name)
    return inp, args, kwargs


def _attempt(fn):
    """(result, None) or (None, exception) of fn(), warnings silenced."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(), None
    except Exception as e:  # noqa: BLE001 - the caller compares it with CPU's
        return None, e


def _brief(e) -> str:
    """An exception in one line: its class and the last line of its message's first
    paragraph (dynamo's wrappers put the cause there)."""
    if e is None:
        return "accepted"
    first = str(e).strip().split("\n\n")[0].splitlines() or [""]
    return f"{type(e).__name__}: {first[0][:100]}" + (f" / {first[-1].strip()[:100]}"
                                                       if len(first) > 1 else "")


def _close(cpu_out, tpu_out, dtype, what="out"):
    reason = compare.values_close(ops._to_cpu(cpu_out), ops._to_cpu(tpu_out), dtype, what=what)
    if reason:
        raise Failed(reason)


# ---------------------------------------------------------------- compare with CPU
def _compare(opinfo, mode):
    dtype = _dtype_of(opinfo)
    grad = opinfo.supports_autograd and dtype.is_floating_point
    try:
        samples = _samples(opinfo, dtype, MAX_SAMPLES, grad=grad, reference=True)
    except Exception:  # noqa: BLE001 - some samples refuse requires_grad (bool masks)
        grad = False
        samples = _samples(opinfo, dtype, MAX_SAMPLES, reference=True)
    ran = 0
    for s in samples:
        r = ops.check_sample(opinfo, s, dtype, "strict" if mode == "compiled" else mode, grad,
                             fn=runner(opinfo.op, mode))
        if r["status"] == "cpu_error":
            continue
        ran += 1
        if r["status"] != "pass":
            raise Failed(f"{r.get('kind')}: {r.get('detail', '')}")
    if not ran:
        raise NotApplicable("no reference sample runs on CPU")


# ---------------------------------------------------------------- out=
def _out_like(t: torch.Tensor, device, how: str) -> torch.Tensor:
    if how == "right":
        return torch.full_like(t, float("nan") if t.is_floating_point() else 1, device=device)
    if how == "noncontiguous":
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=device) \
            if t.dim() else torch.zeros(2, dtype=t.dtype, device=device)
        return wide[..., ::2] if t.dim() else wide[0]
    if how == "shape":
        return torch.zeros(t.numel() + 1, dtype=t.dtype, device=device)
    if how == "empty":
        return torch.empty(0, dtype=t.dtype, device=device)
    if how == "dtype":
        other = torch.long if (t.is_floating_point() or t.is_complex()) else torch.float32
        return torch.zeros_like(t, dtype=other, device=device)
    raise ValueError(how)


def _out_like_all(outs):
    """Non-contiguous host copies of CPU's right outs: the layout _out_like makes."""
    made = []
    for c in outs:
        nc = _out_like(c, "cpu", "noncontiguous")
        nc.copy_(c)
        made.append(nc)
    return made


def _with_out(opinfo, sample, device, outs_of, mode):
    """op(sample, out=...) on `device`: (the out tensors, what the op returned)."""
    inp, args, kwargs = _on(sample, device, opinfo)
    expected = opinfo.op(inp, *args, **kwargs)
    got = _tensors(expected)
    outs = [outs_of(t) for t in got]
    given = [o.stride() for o in outs]
    out = outs[0] if not isinstance(expected, (tuple, list)) else tuple(outs)
    return outs, runner(opinfo.op, mode, device)(inp, *args, **kwargs, out=out), given


def _out_sample(opinfo):
    if not opinfo.supports_out:
        raise NotApplicable("no out= variant")
    dtype = _dtype_of(opinfo)
    for s in _samples(opinfo, dtype, 4):
        inp, args, kwargs = _on(s, "cpu", opinfo)
        res, err = _attempt(lambda: opinfo.op(inp, *args, **kwargs))
        if err is None and _tensors(res) and all(isinstance(t, torch.Tensor)
                                                 for t in compare.leaves(res)):
            return s, dtype
    raise NotApplicable("no sample with tensor results runs on CPU")


def _out(opinfo, mode):
    """The values of each out are CPU's out= values, but for a non-contiguous out: CPU's
    own kernels mishandle some (torch 2.13's gelu.out writes nothing into one, _softmax.out
    writes it as if contiguous), so it is held to CPU's values into a right out. Compiled,
    CPU under dynamo's own values pass too (dynamo loses a 0-dim view out's value on every
    backend: matrix_rank's)."""
    sample, dtype = _out_sample(opinfo)
    # values a random or uninitialized result has are not CPU's: its layout still is
    values = not (_random(opinfo, sample) or opinfo.name.startswith(("empty", "new_empty")))
    right = None
    for how in ("right", "noncontiguous", "shape", "empty", "dtype"):
        cpu, cpu_err = _attempt(lambda: _with_out(opinfo, sample, "cpu",
                                                  lambda t: _out_like(t, "cpu", how), mode))
        with in_mode(mode):
            tpu, tpu_err = _attempt(lambda: _with_out(opinfo, sample, "tpu",
                                                      lambda t: _out_like(t, "tpu", how), mode))
        if cpu_err is not None or tpu_err is not None:
            if type(cpu_err) is not type(tpu_err):
                raise Failed(f"out {how}: CPU {_brief(cpu_err)}; tpu {_brief(tpu_err)}")
            continue
        (couts, _, cgiven), (touts, tres, given) = cpu, tpu
        if mode == "compiled":  # where dynamo restrided CPU's out (linear's), CPU's layout
            given = [c.stride() if c.stride() != cg else g
                     for c, cg, g in zip(couts, cgiven, given)]
        dynamo = None  # compiled: CPU under dynamo's own non-contiguous out, also accepted
        if how == "right":
            right = couts
        elif how == "noncontiguous" and right is not None:
            dynamo = couts if mode == "compiled" else None
            couts = _out_like_all(right)
        if how in ("right", "noncontiguous"):
            returned = _tensors(tres)  # (a list out= returns None: split_with_sizes_copy)
            if tres is not None and (len(returned) != len(touts) or
                                     any(r is not o for r, o in zip(returned, touts))):
                raise Failed(f"out {how}: the op did not return its out tensor")
        for c, t, g in zip(couts, touts, given):
            if t.shape != c.shape:
                raise Failed(f"out {how}: shape {tuple(t.shape)}, CPU {tuple(c.shape)}")
            # a right-sized out keeps its strides (a resized one may take any: torch's
            # own linalg kernels make theirs column-major); compiled, it has CPU's under
            # dynamo (which restrides linear's)
            if how in ("right", "noncontiguous") and t.numel() and t.stride() != g:
                raise Failed(f"out {how}: strides {t.stride()}, given {g}")
        if values and opinfo.name in compare.GAUGE:  # eigenvectors' signs are free
            reason = compare.gauge_close(opinfo.name, ops._to_cpu(couts), ops._to_cpu(touts),
                                         dtype)
            if reason:
                raise Failed(f"out {how}: {reason}")
        elif values:
            try:
                _close(couts, touts, dtype, f"out {how}")
            except Failed:
                if dynamo is None:
                    raise
                _close(dynamo, touts, dtype, f"out {how}")
    if right is None:  # the right out itself refused alike (histogramdd's int bins)
        raise NotApplicable("CPU refuses a right out= for this sample too")
    # a CPU out for tpu inputs: refused
    with in_mode(mode):
        _, err = _attempt(lambda: _with_out(opinfo, sample, "tpu",
                                            lambda t: _out_like(t, "cpu", "right"), mode))
    if not isinstance(err, RuntimeError):
        raise Failed(f"out on CPU for tpu inputs: {'accepted' if err is None else repr(err)}")


def _out_warning(opinfo, mode):
    sample, _ = _out_sample(opinfo)

    def warned(device, how):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _with_out(opinfo, sample, device, lambda t: _out_like(t, device, how), mode)
        return sum(RESIZED in str(w.message) for w in caught)

    for how in ("shape", "right"):
        cpu, cpu_err = _attempt(lambda: warned("cpu", how))
        if cpu_err is not None:
            continue  # the op refuses such an out: the `out` family judges that
        with in_mode(mode):
            tpu = warned("tpu", how)
        # torch's rule (test_out_warning), not CPU's habit: resizing a non-empty out warns
        # (CPU's log_sigmoid.out resizes silently; its OpInfo marks that an expected failure
        # on CPU), a right-sized one does not, unless CPU warns there too (torch's own
        # composite linear.out resizes a 1-D sample's out through another shape); compiled,
        # no warning where CPU under dynamo gives none either (unbind_copy's list out)
        silent_ok = mode == "compiled" and not cpu
        if (how == "shape" and not tpu and not silent_ok) or (how == "right" and tpu and not cpu):
            raise Failed(f"out of {how}: tpu warned {tpu}x (CPU {cpu}x)")


# ---------------------------------------------------------------- error inputs
def _raised(fn, si):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(si.input, *si.args, **si.kwargs)
    except Exception as e:  # noqa: BLE001 - judged by the caller
        return e
    return None


def _to_host(si):
    """The sample on CPU, with its sharing: a tensor passed twice is one tensor (out=x of an
    input x), views of one storage are views of one host storage."""
    memo: dict = {}
    storages: dict = {}

    def host(t):
        if t.device.type != "tpu":
            return t
        if id(t) not in memo:
            key = (id(t.untyped_storage()), t.dtype)
            if key not in storages:
                whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
                storages[key] = whole.cpu().untyped_storage()
            memo[id(t)] = torch.empty(0, dtype=t.dtype).set_(
                storages[key], t.storage_offset(), t.shape, t.stride())
        return memo[id(t)]
    return types.SimpleNamespace(input=ops._map(si.input, host), args=ops._map(list(si.args), host),
                                 kwargs=ops._map(dict(si.kwargs), host))


def _errors(opinfo, mode):
    if opinfo.error_inputs_func is None:
        raise NotApplicable("no error inputs")
    with in_mode(mode):
        cases = list(opinfo.error_inputs("tpu"))
    if not cases:
        raise NotApplicable("no error inputs")
    for ei in cases:
        si = ei.sample_input
        want = f"{ei.error_type.__name__} matching {ei.error_regex!r}"

        def fits(e):
            return isinstance(e, ei.error_type) and re.search(ei.error_regex, str(e)) is not None

        cpu = _raised(runner(opinfo.op, mode, "cpu"), _to_host(si))
        if mode != "compiled" and not fits(cpu):
            continue  # a case CPU itself accepts (or refuses otherwise): not tpu's to meet
        with in_mode(mode):
            err = _raised(runner(opinfo.op, mode), si)
            if err is None:
                try:
                    torch.tpu.synchronize()
                except Exception as late:  # noqa: BLE001
                    raise Failed(f"{want} surfaced at the next sync, not at the call: "
                                 f"{late!r}"[:300]) from None
        if mode == "compiled":  # the error itself (dynamo wraps it), or CPU's under dynamo
            if not (err is not None and (fits(err) or fits(err.__cause__))) and \
                    (type(err) is not type(cpu) or fits(err) != fits(cpu)):
                raise Failed(f"tpu {_brief(err)}; CPU under dynamo {_brief(cpu)}")
        elif err is None:
            raise Failed(f"accepted; CPU raises {want}")
        elif not fits(err):
            raise Failed(f"{type(err).__name__}: {str(err)[:160]}; want {want}")


# ---------------------------------------------------------------- non-contiguous samples
def _grads_of(out, leaves, seed=7):
    targets = [t for t in _tensors(out) if t.requires_grad]
    if not targets or not leaves:
        return []
    g = torch.Generator().manual_seed(seed)
    cots = [torch.randn(t.shape, dtype=t.dtype, generator=g).to(t.device) for t in targets]
    got = torch.autograd.grad(targets, leaves, cots, allow_unused=True)
    return [torch.zeros_like(x) if v is None else v for v, x in zip(got, leaves)]


def _noncontiguous(opinfo, mode):
    dtype = _dtype_of(opinfo)
    if opinfo.has_nondeterministic_output:
        raise NotApplicable("the op's output is nondeterministic by design")
    grad = opinfo.supports_autograd and dtype.is_floating_point
    ran = 0
    for s in _samples(opinfo, dtype, 8, grad=grad):
        runs = []
        for variant in (s, s.noncontiguous()):
            with in_mode(mode):
                inp, args, kwargs, leaves = ops.place(variant, "tpu", grad, name=opinfo.name)
                torch.manual_seed(0)  # a random op draws the same numbers for both layouts
                res, err = _attempt(lambda: runner(opinfo.op, mode)(inp, *args, **kwargs))
                if err is None and grad:
                    g, gerr = _attempt(lambda: _grads_of(res, leaves))
                    res = (res, g if gerr is None else None)
                runs.append((res, err))
        (a, aerr), (b, berr) = runs
        if aerr is not None or berr is not None:
            if (aerr is None) != (berr is None):
                raise Failed(f"contiguous {_brief(aerr)}; non-contiguous {_brief(berr)}")
            continue
        ran += 1
        _close(a, b, dtype, "non-contiguous")
    if not ran:
        raise NotApplicable("no sample runs on tpu")


def _random(opinfo, sample) -> bool:
    """Whether the op draws random numbers for this sample (on CPU, watched: OpInfo seeds
    its random ops itself, so two calls agree on one device and never across devices)."""
    if opinfo.has_nondeterministic_output:
        return True
    watch = ops._SeededOps()
    inp, args, kwargs = _on(sample, "cpu", opinfo)

    def watched():
        with watch:
            opinfo.op(inp, *args, **kwargs)
    _attempt(watched)
    return watch.seeded


# ---------------------------------------------------------------- variants
def _variants(opinfo, mode):
    dtype = _dtype_of(opinfo)
    if opinfo.has_nondeterministic_output:
        raise NotApplicable("the op's output is nondeterministic by design")
    named = {"method": opinfo.method_variant, "inplace": opinfo.inplace_variant,
             "operator": opinfo.operator_variant,
             "inplace operator": opinfo.inplace_operator_variant}
    named = {k: v for k, v in named.items() if v is not None}
    if not named:
        raise NotApplicable("the function is the only variant")
    for s in _samples(opinfo, dtype, 4):
        if _random(opinfo, s):
            continue  # torch's own variants draw differently (CUDA's dropout_ and dropout)
        for name, variant in named.items():
            def call(device):
                inp, args, kwargs = _on(s, device, opinfo)
                torch.manual_seed(0)  # a random op draws the same numbers in each variant
                base = opinfo.op(inp, *args, **kwargs)
                if "inplace" in name and isinstance(base, torch.Tensor) and \
                        base.dtype != inp.dtype:
                    raise NotApplicable  # (torch checks in-place variants only there)
                inp, args, kwargs = _on(s, device, opinfo)
                torch.manual_seed(0)
                return base, runner(variant, mode, device)(inp, *args, **kwargs)
            cpu, cpu_err = _attempt(lambda: call("cpu"))
            with in_mode(mode):
                tpu, tpu_err = _attempt(lambda: call("tpu"))
            if cpu_err is not None or tpu_err is not None:
                if type(cpu_err) is not type(tpu_err):
                    raise Failed(f"{name}: CPU {_brief(cpu_err)}; tpu {_brief(tpu_err)}")
                continue
            _close(tpu[0], tpu[1], dtype, name)


# ---------------------------------------------------------------- dtypes
def _dtypes(opinfo, mode):
    ran = 0
    for dtype in DTYPES:
        if dtype not in opinfo.supported_dtypes("cpu"):
            continue
        samples = _samples(opinfo, dtype, 1)
        if not samples:
            continue
        inp, args, kwargs = _on(samples[0], "cpu", opinfo)
        want, err = _attempt(lambda: opinfo.op(inp, *args, **kwargs))
        if err is not None or _random(opinfo, samples[0]):
            continue
        ran += 1
        with in_mode(mode):
            inp, args, kwargs = _on(samples[0], "tpu", opinfo)
            got, err = _attempt(lambda: ops._to_cpu(runner(opinfo.op, mode)(inp, *args, **kwargs)))
        if err is not None:
            if "does not support dtype" in str(err):
                continue  # a clear refusal of a dtype the device does not have
            raise Failed(f"{dtype}: {type(err).__name__}: {str(err)[:160]}")
        want = ops._to_cpu(want)
        if opinfo.name in compare.INDEXED:  # ties may pick other indices, validly
            reason = compare.indexed_close(opinfo.name, samples[0], want, got, dtype)[0]
        elif opinfo.name in compare.GAUGE:
            reason = compare.gauge_close(opinfo.name, want, got, dtype)
        else:
            reason = compare.values_close(want, got, dtype)
            if reason:
                reason = ops.rounding_verdict(reason, opinfo.op, samples[0], dtype, want, got)
        if reason:
            raise Failed(f"{dtype}: {reason}")
    if not ran:
        raise NotApplicable("no dtype runs on CPU")


_CHECKS = {"compare": _compare, "out": _out, "out_warning": _out_warning, "errors": _errors,
           "noncontiguous": _noncontiguous, "variants": _variants, "dtypes": _dtypes}


def run(family: str, opinfo, mode: str) -> None:
    """One family's check of one op: returns, or raises Failed / NotApplicable."""
    if mode == "compiled":
        import torch._dynamo as dynamo

        dynamo.reset()
        dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    with warnings.catch_warnings():
        # a sweep runs each op at many shapes by design
        warnings.simplefilter("ignore", RecompileWarning)
        _CHECKS[family](opinfo, mode)


def check(family: str, opinfo, mode: str) -> dict:
    """The verdict as the sweep stores it."""
    why = declared(family, opinfo)
    if why:
        return {"status": "declared", "detail": why}
    try:
        run(family, opinfo, mode)
    except NotApplicable as e:
        return {"status": "na", "detail": str(e)}
    except Failed as e:
        return {"status": "fail", "detail": str(e)[:400]}
    except Exception as e:  # noqa: BLE001 - the harness itself broke on this op
        return {"status": "fail", "detail": f"harness: {type(e).__name__}: {str(e)[:300]}"}
    finally:
        with contextlib.suppress(Exception):
            torch.tpu.synchronize()
    return {"status": "pass"}
