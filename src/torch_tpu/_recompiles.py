"""Why a program compiled again, and the warning when one site keeps compiling.

Every program cache (_program_cache.py: Strict's op entries, DeferAndFuse's fused graphs,
torch.compile's graphs) asks `why` on each miss: the reason names what differs from the
last program compiled for the same op, op sequence or graph (a dimension's size, a scalar
type, the float32 precision), and it is what CacheMissError, TORCH_TPU_DUMP_DIR's headers
and compile_cache_stats() show. The shape changes it finds are then counted by `storm`:

  storms      a site (an op at one user line, a fused op sequence recorded up to one
              line, a compiled graph) that has recompiled TORCH_TPU_RECOMPILE_WARN times
              (default 8) for new shapes warns once (RecompileWarning, at the user's
              line), naming the dimension that varies and the remedy; past three such
              sites (a model whose length varies storms at every op) they are only
              listed, in STORMS (compile_cache_stats()["storms"])

Both tables are bounded: past _MAX_SITES sites, they start again.
"""
from __future__ import annotations

import warnings

import torch

from . import _config, _frames, metrics


class RecompileWarning(UserWarning):
    """One program site keeps compiling programs for new shapes."""


_LAST: dict = {}      # (kind, what) -> (parts, precision) of the last program compiled for it
_SITES: dict = {}     # storm site -> [shape recompiles, {(argument, dim): sizes seen}, warned]
_MAX_SITES = 10000
STORMS: list = []     # the sites that stormed: what, where, recompiles, what varies
_STORMS_WARNED = 3    # a model whose sequence length varies storms at every op: warn 3


def why(what, parts, prec, names, nested=False):
    """-> (why a program is compiled for `parts`, the shape changes against the last
    one compiled for `what`); remembers `parts` as the last."""
    last = _LAST.get(what)
    if len(_LAST) > _MAX_SITES:
        _LAST.clear()
    _LAST[what] = (parts, prec)
    if last is None:
        return "first program for it in this process", []
    old, old_prec = last
    if old == parts and old_prec != prec:
        return f"the float32 matmul/convolution precision changed from {old_prec} to {prec}", []
    changes = []
    if nested:  # per node: (label, argument names) each
        for (label, argnames), a, b in zip(names, old, parts):
            changes += _changes(a, b, argnames, label + " argument ")
    else:
        changes = _changes(old, parts, names, "argument ")
    if changes:
        shown = "; ".join(_show(c) for c in changes[:3])
        return f"shapes changed: {shown}" + (" ..." if len(changes) > 3 else ""), changes
    for i, (a, b) in enumerate(zip(old, parts)):
        if a != b:
            return f"argument {_name(names, i)} changed from {a!r:.200} to {b!r:.200}", []
    return "the arguments changed", []


def _name(names, i):
    return f"`{names[i]}`" if i < len(names) else f"#{i}"


def _is_spec(p):
    return (isinstance(p, tuple) and len(p) >= 6 and isinstance(p[0], (tuple, torch.Size))
            and all(type(s) is int for s in p[0]))


def _changes(old, new, names, prefix):
    """[(label, dim or None, old size, new size)] of the tensor shapes (and the size
    arguments of compiled graphs) that differ between two keys' parts."""
    out = []
    if not (isinstance(old, tuple) and isinstance(new, tuple)) or len(old) != len(new):
        return out
    for i, (a, b) in enumerate(zip(old, new)):
        label = prefix + _name(names, i)
        if type(a) is int and type(b) is int and a != b:
            out.append((label, None, a, b))
        pairs = [(label, a, b)]
        if (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and a
                and not _is_spec(a) and all(x is None or _is_spec(x) for x in a)):
            pairs = [(f"{label}[{j}]", x, y) for j, (x, y) in enumerate(zip(a, b))]
        for lab, x, y in pairs:
            if not (_is_spec(x) and _is_spec(y)):
                continue
            sx, sy = tuple(x[0]), tuple(y[0])
            if len(sx) != len(sy):
                out.append((lab, None, sx, sy))
            else:
                out += [(lab, d, p, q) for d, (p, q) in enumerate(zip(sx, sy)) if p != q]
            if sx == sy and x[4] != y[4]:
                out.append((lab + " storage", None, x[4], y[4]))
    return out


def _show(change):
    label, dim, a, b = change
    return f"{label} {'' if dim is None else f'dim {dim} '}{a} -> {b}"


def storm(site, what, line, changes):
    """Count a compile caused by new shapes at `site`; warn once at the threshold, at the
    user's `line` ((file, line); None: the caller's caller)."""
    if not changes:
        return
    n_warn = _config.get("TORCH_TPU_RECOMPILE_WARN")
    st = _SITES.get(site)
    if st is None:
        if len(_SITES) > _MAX_SITES:
            _SITES.clear()
        st = _SITES[site] = [0, {}, False]
    st[0] += 1  # recompiles: programs after the site's first
    for label, dim, a, b in changes:
        seen = st[1].setdefault((label, dim), [])
        for v in (a, b):
            if v not in seen and len(seen) < 12:
                seen.append(v)
    if st[2] or not n_warn or st[0] < n_warn:
        return
    st[2] = True
    metrics.counters["programs.recompile_storms"] += 1
    varying = "; ".join(
        f"{label}{'' if dim is None else f' dim {dim}'} took {len(v)}"
        f"{'+' if len(v) >= 12 else ''} sizes ({', '.join(map(str, v[:6]))}{', ...' if len(v) > 6 else ''})"
        for (label, dim), v in list(st[1].items())[:4])
    where = _frames.location(*line) if line else what
    if len(STORMS) < 100:
        STORMS.append({"what": what, "where": where, "recompiles": st[0], "varying": varying})
    if len(STORMS) > _STORMS_WARNED:
        return
    more = (" Further sites that keep recompiling are listed in "
            "torch.tpu.compile_cache_stats()['storms'], not warned about."
            if len(STORMS) == _STORMS_WARNED else "")
    message = (
        f"torch_tpu: {what} has compiled {st[0] + 1} programs, one for each new "
        f"shape ({st[0]} recompiles): XLA programs have static shapes. Varying: {varying}. Remedy: pad that "
        f"dimension to a few fixed sizes, masking the padding, so a few programs serve every "
        f"size: `torch_tpu.pad_to_bucket(batch)` pads a batch's length to its bucket (powers "
        f"of two, or `torch_tpu.set_buckets([...])`); docs/DYNAMIC_SHAPES.md says which "
        f"variation is already free (view offsets, HF generate's lengths). (TORCH_TPU_RECOMPILE_WARN sets the threshold; 0 "
        f"turns this warning off.){more}")
    if line:
        warnings.warn_explicit(message, RecompileWarning, line[0], line[1])
    else:
        warnings.warn(message, RecompileWarning, stacklevel=4)
