"""Why a program compiled again, and the warning when one site keeps compiling.

Every program cache (_program_cache.py: Strict's op entries, DeferAndFuse's fused graphs,
torch.compile's graphs) asks `why` on each miss: the reason names what differs from the
last program compiled for the same op, op sequence or graph (a dimension's size, a scalar
type, the float32 precision), and it is what CacheMissError, TORCH_TPU_DUMP_DIR's headers
and compile_cache_stats() show. Then `storm` counts the miss at its site:

  sites       an op at one user line with the same parameters (the storages of the leaf
              tensors that require grad: a layer's weights; those an in-place op updates:
              an optimizer's state for one parameter), a fused op sequence recorded up to
              one line, a compiled graph.
              Layers of different fixed sizes reached from one line (a loop over blocks,
              `optimizer.step()`) are so many sites, each compiling once: no storm. One
              site that keeps meeting new shapes is one: each new key is compared with
              the site's own last one, so the warning names the dimension that varies
              there (a growing length), not the sizes of whichever layer came before.
  storms      a site that has recompiled TORCH_TPU_RECOMPILE_WARN times (default 8) for
              new shapes warns once (RecompileWarning, at the user's line), naming the
              dimension and the remedy that fits it: a dimension that grows step by step
              (a `torch.cat` of a new token) wants a fixed-capacity buffer, one that jumps
              about (dynamic padding) wants padding to a few sizes. Past three such sites
              (a model whose length varies storms at every op) they are only listed, in
              STORMS (compile_cache_stats()["storms"]).

Both tables are bounded: past _MAX_SITES sites, they start again.
"""
from __future__ import annotations

import sys
import threading
import warnings

import torch

from . import _config, _frames, _on_import, metrics


class RecompileWarning(UserWarning):
    """One program site keeps compiling programs for new shapes."""


_LAST: dict = {}      # (kind, what) -> (parts, precision) of the last program compiled for it
_SITES: dict = {}     # storm site -> [shape recompiles, {(argument, dim): sizes seen}, warned, last parts]
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


# the optimizer steps this thread is in: the frame of torch's step wrapper for each, as a
# step that raises never runs its post hook (a counter would then stay up for good and
# silence every later warning); a frame no longer on the stack is a step that is over
_IN_STEP = threading.local()


def _step_pre(optimizer, args, kwargs):
    _steps().append(sys._getframe(1))  # (the wrapper that calls the hooks and the step)


def _step_post(optimizer, args, kwargs):
    steps = getattr(_IN_STEP, "frames", None)
    if steps:  # (its own frame, last: _step_pre dropped the steps that raised)
        steps.pop()


def _steps() -> list:
    """This thread's optimizer steps still running (those that raised dropped)."""
    frames = getattr(_IN_STEP, "frames", None)
    if frames is None:
        frames = _IN_STEP.frames = []
    elif frames:
        running = set()
        f = sys._getframe(1)
        while f is not None:
            running.add(id(f))
            f = f.f_back
        frames[:] = [f for f in frames if id(f) in running]
    return frames


def _hook_optimizer_steps():
    """torch's global hooks around every Optimizer.step (subclasses' included)."""
    import torch.optim.optimizer as optimizer

    optimizer.register_optimizer_step_pre_hook(_step_pre)
    optimizer.register_optimizer_step_post_hook(_step_post)


# (torch.optim may still be loading when torch's device autoload imports torch_tpu)
_on_import.when_imported("torch.optim.optimizer", _hook_optimizer_steps,
                         lambda m: hasattr(m, "register_optimizer_step_post_hook"))


def layered() -> bool:
    """Whether the calling thread runs where a model's layers all meet one user line: a
    backward pass (its ops name the backward() line) or an optimizer step (the step()
    line, or one line of an optimizer's per-parameter loop). Layers of different shapes
    there are not one site recompiling; the forward's sites show real variation."""
    return torch._C._current_graph_task_id() != -1 or bool(_steps())


def subject(plan, vals) -> tuple:
    """What an op call works on that makes it a site of its own: the storages of the leaf
    tensors that require grad among its arguments (lists included), or whose views they
    are (`weight.t()` in a Linear, under no_grad too), and for an in-place op the
    storages it updates (an optimizer's state, one tensor per parameter)."""
    out = []
    inplace = plan.mutable if plan.op.overloadpacket.__name__.endswith("_") else ()
    for i, v in enumerate(vals):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, torch.Tensor):
                base = x if x._base is None else x._base
                if i in inplace or (base.requires_grad and base.is_leaf):
                    out.append(id(base.untyped_storage()))
    return tuple(out)


def storm(site, what, line, parts, names, nested=False):
    """Count a compile for `parts` at `site`; when the shapes changed from the site's last
    program, it is a recompile, and the site warns once at the threshold, at the user's
    `line` ((file, line); None: the caller's caller)."""
    st = _SITES.get(site)
    if st is None:
        if len(_SITES) > _MAX_SITES:
            _SITES.clear()
        _SITES[site] = [0, {}, False, parts]
        return
    last, st[3] = st[3], parts
    if nested:  # per node: (label, argument names) each
        changes = [c for (label, argnames), a, b in zip(names, last, parts)
                   for c in _changes(a, b, argnames, label + " argument ")]
    else:
        changes = _changes(last, parts, names, "argument ")
    if not changes:
        return
    n_warn = _config.get("TORCH_TPU_RECOMPILE_WARN")
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
        f"shape ({st[0]} recompiles): XLA programs have static shapes. Varying: {varying}. "
        f"{_remedy(st[1])} docs/DYNAMIC_SHAPES.md says which variation is already free "
        f"(view offsets, HF generate's lengths). (TORCH_TPU_RECOMPILE_WARN sets the "
        f"threshold; 0 turns this warning off.){more}")
    if line:
        warnings.warn_explicit(message, RecompileWarning, line[0], line[1])
    else:
        warnings.warn(message, RecompileWarning, stacklevel=4)


def _grows(seen) -> bool:
    """Whether a dimension's sizes, in the order they came, grew by small steps (a tensor
    extended by `torch.cat` each step) rather than jumping about (batches of any length)."""
    sizes = [s for s in seen if type(s) is int]
    steps = [b - a for a, b in zip(sizes, sizes[1:])]
    return len(steps) >= 3 and all(0 < s <= 8 for s in steps)


def _remedy(seen: dict) -> str:
    if any(_grows(v) for v in seen.values()):
        return ("Remedy: a tensor that grows step by step (a `torch.cat` of each new token) "
                "is held at its length's bucket when it grows along its outermost dimension "
                "that is not of size 1 (a batch of 1), and row-wise ops on it (pointwise, "
                "linear, layer norm, embedding, causal attention) compile per bucket; this op "
                "met it otherwise (another dimension, or an op that reads across the length: "
                "docs/DYNAMIC_SHAPES.md, \"Growing tensors\"). Keep such a tensor in a buffer "
                "of fixed capacity and read results at the true length (padding at the end "
                "moves what the last position is); HF `generate()` does this already.")
    return ("Remedy: pad that dimension to a few fixed sizes, masking the padding, so a few "
            "programs serve every size: for HF batches, a collator's `pad_to_multiple_of=64` "
            "(`DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64)`, and Trainer's "
            "`data_collator`), or `torch_tpu.pad_to_bucket(batch)` before `.to(device)` (its "
            "length to a bucket: powers of two, or `torch_tpu.set_buckets([...])`).")
