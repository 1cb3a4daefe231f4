"""How a tpu result is judged against CPU's: values within tolerance, random results on
their statistics, and (values, indices) results on values plus the validity of the indices.

Every function returns None when the results agree and a one-line reason when they do not.
"""
from __future__ import annotations

import math

import torch

from . import tolerances


def leaves(out) -> list:
    """The leaves of an op's result, in order: tensors, and Python values to compare as is."""
    if isinstance(out, (list, tuple)):
        return [x for o in out for x in leaves(o)]
    if isinstance(out, dict):
        return [x for k in sorted(out) for x in leaves(out[k])]
    return [out]


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return t.to(torch.complex128)
    if t.is_floating_point():
        return t.to(torch.float64)
    return t


def tensor_close(cpu: torch.Tensor, tpu: torch.Tensor, rtol: float, atol: float,
                 what: str = "out") -> str | None:
    if tuple(tpu.shape) != tuple(cpu.shape):
        return f"{what}: shape {tuple(tpu.shape)} != cpu {tuple(cpu.shape)}"
    if tpu.dtype != cpu.dtype:
        return f"{what}: dtype {tpu.dtype} != cpu {cpu.dtype}"
    if cpu.numel() == 0:
        return None
    a, b = _wide(tpu), _wide(cpu)
    if not (cpu.is_floating_point() or cpu.is_complex()):
        bad = a != b
        if bool(bad.any()):
            return f"{what}: {int(bad.sum())}/{cpu.numel()} elements differ (exact dtype {cpu.dtype})"
        return None
    ok = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if bool(ok.all()):
        return None
    bad = ~ok
    finite = bad & torch.isfinite(a) & torch.isfinite(b)
    diff = float((a - b).abs()[finite].max()) if bool(finite.any()) else float("nan")
    return (f"{what}: {int(bad.sum())}/{cpu.numel()} elements differ, max |diff| {diff:.3g} "
            f"(rtol {rtol:g}, atol {atol:g})")


def values_close(cpu_out, tpu_out, dtype, grad: bool = False, what: str = "out") -> str | None:
    """Every leaf of `tpu_out` (already on CPU) against `cpu_out`."""
    cl, tl = leaves(cpu_out), leaves(tpu_out)
    if len(cl) != len(tl):
        return f"{what}: {len(tl)} results != cpu {len(cl)}"
    for i, (c, t) in enumerate(zip(cl, tl)):
        name = f"{what}[{i}]" if len(cl) > 1 else what
        if isinstance(c, torch.Tensor) != isinstance(t, torch.Tensor):
            return f"{name}: {type(t).__name__} != cpu {type(c).__name__}"
        if isinstance(c, torch.Tensor):
            rtol, atol = tolerances.loosest(dtype, c.dtype)
            if grad:
                rtol, atol = rtol * tolerances.GRAD_FACTOR, atol * tolerances.GRAD_FACTOR
            reason = tensor_close(c, t, rtol, atol, name)
            if reason:
                return reason
        elif isinstance(c, float) and isinstance(t, float):
            if not (c == t or (math.isnan(c) and math.isnan(t)) or
                    math.isclose(c, t, rel_tol=tolerances.forward(dtype)[0])):
                return f"{name}: {t!r} != cpu {c!r}"
        elif c != t:
            return f"{name}: {t!r} != cpu {c!r}"
    return None


def as_accurate(cpu_out, tpu_out, ref_out, dtype, grad: bool = False,
                what: str = "out") -> str | None:
    """None when `tpu_out` is as accurate as `cpu_out`, both measured against `ref_out`
    (the same computation in a wider dtype): every element of tpu's is within tolerance
    of the reference, or no further from it than twice CPU's largest (finite) distance
    from it. This judges results where float32 rounding decides (sums that cancel, a
    series' last terms): there CPU's value is one rounding of the truth and tpu's
    another."""
    cl, tl, rl = leaves(cpu_out), leaves(tpu_out), leaves(ref_out)
    if not len(cl) == len(tl) == len(rl):
        return f"{what}: {len(tl)} results != cpu {len(cl)}"
    for i, (c, t, r) in enumerate(zip(cl, tl, rl)):
        if not all(isinstance(x, torch.Tensor) for x in (c, t, r)):
            continue  # values_close already judged the non-tensor leaves
        if not (c.is_floating_point() or c.is_complex()) or t.shape != r.shape:
            return values_close(c, t, dtype, grad, what)
        rtol, atol = tolerances.loosest(dtype, c.dtype)
        if grad:
            rtol, atol = rtol * tolerances.GRAD_FACTOR, atol * tolerances.GRAD_FACTOR
        tw, cw, rw = _wide(t), _wide(c), _wide(r)
        t_err, c_err = (tw - rw).abs(), (cw - rw).abs()
        c_err = c_err[torch.isfinite(c_err)]
        c_worst = float(c_err.max()) if c_err.numel() else 0.0
        allowed = torch.clamp(atol + rtol * rw.abs(), min=2 * c_worst)
        same_nan = torch.isnan(tw) & torch.isnan(rw)
        ok = same_nan | (t_err <= allowed)
        if not bool(ok.all()):
            name = f"{what}[{i}]" if len(cl) > 1 else what
            return (f"{name}: {int((~ok).sum())}/{t.numel()} elements further from the "
                    f"float64 result than CPU's, max |diff| {float(t_err[~ok].max()):.3g}")
    return None


def shapes_dtypes(cpu_out, tpu_out) -> str | None:
    cl, tl = leaves(cpu_out), leaves(tpu_out)
    if len(cl) != len(tl):
        return f"{len(tl)} results != cpu {len(cl)}"
    for i, (c, t) in enumerate(zip(cl, tl)):
        if isinstance(c, torch.Tensor):
            if not isinstance(t, torch.Tensor):
                return f"out[{i}]: {type(t).__name__} != cpu Tensor"
            if tuple(t.shape) != tuple(c.shape) or t.dtype != c.dtype:
                return (f"out[{i}]: {tuple(t.shape)} {t.dtype} != cpu "
                        f"{tuple(c.shape)} {c.dtype}")
    return None


# ---------------------------------------------------------------- random ops
def statistics_close(cpu_runs: list, tpu_out) -> str | None:
    """A random op: the same shapes and dtypes as CPU, and each tensor's values inside CPU's
    range (pooled over seeds, with slack) with a mean within RANDOM_Z standard errors."""
    reason = shapes_dtypes(cpu_runs[0], tpu_out)
    if reason:
        return reason
    per_run = [leaves(r) for r in cpu_runs]
    for i, t in enumerate(leaves(tpu_out)):
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_complex():
            continue
        pool = torch.cat([r[i].detach().reshape(-1).to(torch.float64) for r in per_run])
        x = t.detach().reshape(-1).to(torch.float64)
        if bool(torch.isnan(pool).any()) != bool(torch.isnan(x).any()):
            return f"out[{i}]: NaNs on {'tpu' if torch.isnan(x).any() else 'cpu'} only"
        pool, x = pool[~torch.isnan(pool)], x[~torch.isnan(x)]
        if pool.numel() == 0 or x.numel() == 0:
            continue
        if bool(torch.isinf(pool).any()) or bool(torch.isinf(x).any()):
            continue
        lo, hi = float(pool.min()), float(pool.max())
        slack = tolerances.RANDOM_RANGE_SLACK * (hi - lo) + 1e-6 * max(abs(lo), abs(hi), 1.0)
        if float(x.min()) < lo - slack or float(x.max()) > hi + slack:
            return (f"out[{i}]: tpu range [{float(x.min()):.4g}, {float(x.max()):.4g}] outside "
                    f"cpu's [{lo:.4g}, {hi:.4g}]")
        sd = float(pool.std()) if pool.numel() > 1 else 0.0
        se = tolerances.RANDOM_Z * sd * math.sqrt(1 / x.numel() + 1 / pool.numel())
        bound = se + 1e-6 * max(abs(float(pool.mean())), 1.0) + (hi - lo) * 1e-3
        if abs(float(x.mean()) - float(pool.mean())) > bound:
            return (f"out[{i}]: tpu mean {float(x.mean()):.4g} vs cpu {float(pool.mean()):.4g} "
                    f"(bound {bound:.3g})")
    return None


# ---------------------------------------------------------------- (values, indices) ops
# op_db name -> result positions that are a kernel's scratch for its backward, not values:
# the normalizations' saved statistics. torch's meta kernels (which CUDA and tpu follow)
# make them float32 for half-precision inputs, and batch norm's (C,) in every mode; its CPU
# kernels make them the input's dtype, and batch norm's empty in eval mode. Debug mode's
# CPU check leaves them out for the same reason.
SCRATCH = {name: (1, 2) for name in ("native_batch_norm", "_native_batch_norm_legit",
                                     "_batch_norm_with_update", "native_layer_norm")}


def without(out, positions):
    """`out` with the results at `positions` left out."""
    return tuple(x for i, x in enumerate(out) if i not in positions)


# op_db name -> (position of `dim` among the args after the input, default dim, position
# of `keepdim` or None). Ties make the indices of these ops ambiguous: any index whose
# element equals the chosen value is valid.
INDEXED = {
    "sort": (0, -1, None), "argsort": (0, -1, None), "topk": (1, -1, None),
    "kthvalue": (1, -1, 2), "mode": (0, -1, 1), "median": (0, None, 1),
    "nanmedian": (0, None, 1), "max": (0, None, 1), "min": (0, None, 1),
    "argmax": (0, None, 1), "argmin": (0, None, 1), "cummax": (0, None, None),
    "cummin": (0, None, None),
}


def _arg(sample, pos, name, default):
    if name in sample.kwargs:
        return sample.kwargs[name]
    return sample.args[pos] if len(sample.args) > pos else default


def _take(x: torch.Tensor, idx: torch.Tensor, dim, keepdim: bool) -> torch.Tensor:
    if dim is None:
        return x.reshape(-1)[idx.reshape(-1)].reshape(idx.shape)
    if x.dim() == 0:
        return x.expand(idx.shape) if idx.numel() else x.reshape(idx.shape)
    if not keepdim and idx.dim() < x.dim():
        return torch.take_along_dim(x, idx.unsqueeze(dim), dim).squeeze(dim)
    return torch.take_along_dim(x, idx, dim)


def indexed_close(name: str, sample, cpu_out, tpu_out, dtype) -> tuple[str | None, bool]:
    """Values compared; each tpu index must select an element equal to CPU's choice.
    Returns (reason, indices_identical)."""
    dim_pos, default_dim, keep_pos = INDEXED[name]
    dim = _arg(sample, dim_pos, "dim", default_dim)
    keepdim = bool(_arg(sample, keep_pos, "keepdim", False)) if keep_pos is not None else False
    x = sample.input.detach()
    cl, tl = leaves(cpu_out), leaves(tpu_out)
    reason = shapes_dtypes(cpu_out, tpu_out)
    if reason:
        return reason, False
    if len(cl) == 1 and cl[0].dtype == torch.int64 and name.startswith("arg"):
        ci, ti = cl[0], tl[0]
        if ci.numel() == 0:
            return None, True
        if int(ti.min()) < -x.numel() or int(ti.max()) >= max(x.numel(), 1):
            return "indices out of range", False
        same = bool((ci == ti).all())
        return tensor_close(_take(x, ci, dim, keepdim), _take(x, ti, dim, keepdim), 0, 0,
                            "values at indices"), same
    if len(cl) != 2 or cl[1].dtype != torch.int64:
        return values_close(cpu_out, tpu_out, dtype), True  # e.g. max(a, b), median(x)
    (cv, ci), (tv, ti) = cl, tl
    if name == "topk" and not _arg(sample, 3, "sorted", True):
        d = -1 if dim is None else dim
        order_c, order_t = cv.argsort(dim=d), tv.argsort(dim=d)
        cv, tv = cv.gather(d, order_c), tv.gather(d, order_t)
        ci, ti = ci.gather(d, order_c), ti.gather(d, order_t)
    reason = values_close(cv, tv, dtype, what="values")
    if reason or ci.numel() == 0:
        return reason, reason is None
    try:
        picked = _take(x, ti, dim, keepdim)
    except (IndexError, RuntimeError) as e:
        return f"indices invalid: {str(e).splitlines()[0][:120]}", False
    reason = tensor_close(_take(x, ci, dim, keepdim), picked, 0, 0, "elements at tpu indices")
    return reason, bool((ci == ti).all())


# ---------------------------------------------------------------- decompositions
def _svd_parts(u, s, vh):
    k = s.shape[-1]
    return [s, (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :]]


def _qr_parts(q, r):
    return [r.abs()] if q.numel() == 0 else [r.abs(), q @ r]


# Decompositions are unique only up to a gauge (the signs, or phases, of singular and
# eigen vectors; the signs of Q's columns): they are compared on what the gauge leaves
# fixed, the spectrum and the reconstruction.
GAUGE = {
    "svd": lambda u, s, v: _svd_parts(u, s, v.mH),
    "linalg.svd": _svd_parts,
    "linalg.eigh": lambda w, v: [w, (v * w.unsqueeze(-2)) @ v.mH],
    # eigenvectors of a general matrix: each column's complex scale is free
    "linalg.eig": lambda w, v: [w, (v * w.unsqueeze(-2)) @ torch.linalg.inv(v)],
    "qr": _qr_parts,
    "linalg.qr": _qr_parts,
}


def gauge_close(name: str, cpu_out, tpu_out, dtype) -> str | None:
    reason = shapes_dtypes(cpu_out, tpu_out)
    if reason:
        return reason
    parts = GAUGE[name]
    return values_close(parts(*leaves(cpu_out)), parts(*leaves(tpu_out)), dtype,
                        what="invariant")
