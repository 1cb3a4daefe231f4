"""Changes to a dynamo graph before AOTAutograd traces it (compile.backend calls these):
what eager does that AOTAutograd's tracing would lose or get wrong on tpu, each with its
reason, checked against CPU eager by tests/compile/test_compile.py.
"""
from __future__ import annotations

import torch


def check_out_devices(gm) -> None:
    """An out= on another device than the op's tpu inputs is refused, as eager refuses it.
    AOTAutograd would not: it functionalizes `op(..., out=o)` into the op and a copy into
    `o`, and a copy may cross devices (torch's fake kernels check the out's device for
    some ops only: slice_scatter's, for one, does not)."""
    def device(a):
        v = getattr(a, "meta", {}).get("example_value")
        return v.device if isinstance(v, torch.Tensor) else None

    for node in gm.graph.nodes:
        out = node.kwargs.get("out") if node.op == "call_function" else None
        if out is None:
            continue
        args = (*node.args, *(v for k, v in node.kwargs.items() if k != "out"))
        ins = [device(x) for a in args for x in (a if isinstance(a, (list, tuple)) else (a,))]
        want = next((d for d in ins if d is not None and d.type == "tpu"), None)
        for o in out if isinstance(out, (list, tuple)) else (out,):
            got = device(o)
            if want is not None and got is not None and got.type != "tpu":
                where = [ln for ln in (node.meta.get("stack_trace") or "").splitlines()
                         if ln.strip().startswith("File ")][-1:]
                raise RuntimeError(f"Expected out tensor to have device {want}, but got {got} "
                                   f"instead ({getattr(node.target, '__name__', node.target)}"
                                   f"{', ' + where[0].strip() if where else ''})")


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
                       eps, *, out=None):
    """torch.native_batch_norm(..., out=) as torch's decomposition redirects it (to
    _native_batch_norm_legit, whose schema marks the running stats as written), then
    copied into the outs, applied to the dynamo graph, above AOTAutograd's
    functionalization: from the decomposition table, below it, AOTAutograd found the
    mutating op in its functional graph and refused the graph."""
    from torch._decomp.decompositions import native_batch_norm_decomposition
    from torch._prims_common.wrappers import _maybe_resize_out, _safe_copy_out

    res = native_batch_norm_decomposition(input, weight, bias, running_mean, running_var,
                                          training, momentum, eps)
    if out is None:
        return res
    for o, r in zip(out, res):
        _maybe_resize_out(o, r.shape)
        _safe_copy_out(copy_from=r, copy_to=o, exact_dtype=False)
    return out


def _reduction(size_average, reduce, reduction) -> str:
    """A loss's reduction, the legacy arguments' when given (as torch.nn.functional)."""
    if size_average is not None or reduce is not None:
        return torch.nn.functional._Reduction.legacy_get_string(size_average, reduce)
    return reduction


def _multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None,
                       reduce=None, reduction="mean"):
    """F.multi_margin_loss with a 0-dim target's unreduced loss 0-dim, as eager gives it:
    torch's meta kernel, which dynamo traces with, makes it (1,) on every backend
    (inductor on CUDA too)."""
    out = torch.nn.functional.multi_margin_loss(input, target, p, margin, weight, size_average,
                                                reduce, reduction)
    none = _reduction(size_average, reduce, reduction) == "none"
    return out.reshape(()) if none and target.dim() == 0 else out


def _multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """F.multilabel_margin_loss in ops AOTAutograd traces as they are. torch's own
    decomposition, which tracing applies at the Autograd key on every backend, counts the
    target slots after the first -1 as class 0 (CPU under aot_eager: 1.60 for eager's
    1.00), and gives one sample's unreduced loss the shape (1,)."""
    reduction = _reduction(size_average, reduce, reduction)
    torch.nn.functional._Reduction.get_enum(reduction)  # (refuses an unknown one)
    torch._check(input.dim() == 0 or (input.dim() <= 2 and input.shape[-1] != 0), lambda: (
        f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
        f"{input.shape}"))
    x = torch.atleast_2d(input)
    torch._check(target.shape == input.shape if input.dim() == 2 else
                 target.dim() <= 1 and target.numel() == x.shape[-1], lambda: (
        f"inconsistent target size: {target.shape} for input of size: {input.shape}"))
    y = target.reshape(x.shape)
    c = x.shape[-1]
    idx = torch.arange(c, device=y.device)
    used = idx < torch.where(y < 0, idx, c).amin(-1, keepdim=True)  # the slots before a -1
    is_target = (idx == torch.where(used, y, -1).unsqueeze(-1)).any(1)  # (N, C)
    picked = x.gather(-1, torch.where(used, y, 0))                     # x at each slot
    margins = (1 - picked.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / c  # (N, slot, C)
    counted = used.unsqueeze(-1) & ~is_target.unsqueeze(1)
    per = torch.where(counted, margins, 0).sum((1, 2))
    if reduction == "mean":
        return per.mean()
    if reduction == "sum":
        return per.sum()
    return per.reshape(()) if input.dim() <= 1 else per


# calls that must change before AOTAutograd sees them: the out= forms of _OUT_REWRITES,
# every call of _REWRITES
_OUT_REWRITES = {torch.native_batch_norm: _native_batch_norm}  # (out= a tuple of three)
_REWRITES = {torch.nn.functional.multi_margin_loss: _multi_margin_loss,
             torch.nn.functional.multilabel_margin_loss: _multilabel_margin_loss}


def apply(gm) -> None:
    """The graph's calls retargeted as _REWRITES and _OUT_REWRITES say, in place."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        new = _REWRITES.get(node.target)
        if new is None and "out" in node.kwargs:
            new = _OUT_REWRITES.get(node.target)
        if new:
            node.target = new
            changed = True
    if changed:
        gm.recompile()
