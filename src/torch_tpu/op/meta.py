"""An op's result specs for a new key, from torch's meta kernels: the shapes and dtypes of
its results, their layouts and which of them alias an argument (OpPlan.compile in
op/opcall.py builds the entry from these). A meta kernel also gives torch's error message
for bad input; where torch's meta kernel disagrees with CPU's and CUDA's kernels, the fix
is here (`_META_FIXES`, `_META_INSTEAD`)."""
from __future__ import annotations

import torch

from .. import _storage, _tree
from ..lowering import grouped_mm


def run(plan, vals):
    """Run the op on meta tensors: torch's shape and dtype rules, and torch's error
    message for bad input. NotImplemented if the op has no meta kernel."""
    margs = [_tree.to_meta(v) for v in vals]
    kw = {plan.names[i]: margs[i] for i in range(plan.npos, len(margs))}
    try:
        meta = _META_INSTEAD.get(plan.op, plan.op)(*margs[:plan.npos], **kw)
        fix = _META_FIXES.get(plan.op)
        return meta if fix is None else fix(meta, vals)
    except NotImplementedError:
        return NotImplemented
    except (AttributeError, TypeError):
        # a Python meta kernel that breaks on arguments the dispatcher accepted (torch's
        # _thnn_fused_lstm_cell meta reads .device of absent biases): shapes from JAX
        return NotImplemented
    except RuntimeError as e:
        msg = str(e)
        if plan.dynamic_shape:  # e.g. repeat_interleave without output_size: no meta shape
            return NotImplemented
        if "Meta" in msg and ("could not run" in msg.lower() or "no kernel" in msg.lower()):
            return NotImplemented
        raise


def _one_frame_loss(reduction_i, target_dims):
    """multi_margin_loss and multilabel_margin_loss with reduction='none' of one unbatched
    frame (a target of fewer than `target_dims` dims): torch's Python meta kernel (its
    decomposition, torch 2.13) makes the loss (1,), where CPU's and CUDA's kernels make it
    0-dim (they resize it to {} unless the target is batched)."""
    def fix(meta, vals):
        if vals[reduction_i] != 0 or vals[1].dim() >= target_dims:
            return meta
        if isinstance(meta, tuple):
            return (meta[0].reshape(()),) + meta[1:]
        return meta.reshape(())
    return fix


# op -> the meta function run instead of torch's, where that one states a CUDA kernel's
# limits rather than the op's
_META_INSTEAD = {torch.ops.aten._grouped_mm.default: grouped_mm.meta}
# op -> fix(meta result, vals): where torch's meta kernel's shapes disagree with CPU's and
# CUDA's kernels
_META_FIXES = {
    torch.ops.aten.multi_margin_loss.default: _one_frame_loss(5, 1),
    torch.ops.aten.multilabel_margin_loss_forward.default: _one_frame_loss(2, 2),
}


def _layout(t):
    """(strides, perm) of a meta result: (None, None) when it is contiguous or its layout
    is not a dense permutation of its shape (expanded, overlapping: such a result is made
    contiguous); else its strides, and its dims outermost-first when they are not in
    order (None when only the strides of size-1 dims differ from contiguous ones)."""
    shape, stride = tuple(t.shape), tuple(t.stride())
    expected, contiguous = 1, []
    for n in reversed(shape):
        contiguous.append(expected)
        expected *= n
    if stride == tuple(reversed(contiguous)):
        return None, None
    order = _storage.dense_order(shape, stride)
    if order is None:
        return None, None
    moved = [d for d in order if shape[d] != 1]  # size-1 dims place no element
    return stride, (None if moved == sorted(moved) else order)


def describe(plan, meta):
    """-> (fresh specs, their perms, structure) from the meta kernel's results."""
    rets = meta if isinstance(meta, tuple) else (meta,)
    fresh = []
    perms = []
    structure = []
    if plan.nrets == 0:
        return fresh, perms, ()

    def add(x):
        stride, perm = _layout(x)
        fresh.append((tuple(x.shape), x.dtype, stride))
        perms.append(perm)

    for r, alias in zip(rets, plan.ret_alias):
        if alias is not None:
            structure.append(("alias", alias))
        elif isinstance(r, (list, tuple)):
            structure.append(("list", len(r)))
            for x in r:
                add(x)
        elif isinstance(r, torch.Tensor):
            structure.append(("fresh",))
            add(r)
        else:
            structure.append(("value", r))
    return fresh, perms, tuple(structure)
