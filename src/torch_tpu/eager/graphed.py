"""`torch.tpu.make_graphed_callables`: torch.cuda's partial-network capture on tpu.

Each callable (a function or an nn.Module) is warmed up, then its forward and its backward
are captured as two graphs (eager/capture.py): the backward graph reads what the forward
graph saves for it, as on CUDA. The graphed callable is one autograd node: its forward
copies the arguments into the captured ones (unless they are those tensors) and replays
the forward graph; its backward copies the incoming gradients into the captured ones and
replays the backward graph; the parameters' gradients reach `.grad` through autograd as
usual. A module runs its original forward when its training flag differs from the one it
was captured with, or when grad mode is off, as CUDA's does. The outputs are the graph's
own tensors: the next call overwrites them, as on CUDA.
"""
from __future__ import annotations

import torch
from torch.utils import _pytree

from .capture import TPUGraph, graph


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool=None):
    if torch.is_autocast_enabled("tpu"):
        raise RuntimeError("make_graphed_callables does not support the autocast caching. "
                           "Please set `cache_enabled=False`.")
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    graphed = [_graph_one(fn, tuple(args), num_warmup_iters, allow_unused_input)
               for fn, args in zip(callables, sample_args)]
    return graphed[0] if single else tuple(graphed)


def _graph_one(fn, args, warmup, allow_unused):
    module = fn if isinstance(fn, torch.nn.Module) else None
    params = tuple(module.parameters()) if module is not None else ()
    inputs = args + params
    wants = [t for t in inputs if t.requires_grad]

    def grads_of(outs, grad_outs):
        diff = [o for o in outs if o.requires_grad]
        return torch.autograd.grad(diff, wants, grad_outputs=grad_outs, allow_unused=allow_unused)

    for _ in range(warmup):
        outs = _pytree.tree_leaves(fn(*args))
        grads_of(outs, [torch.ones_like(o) for o in outs if o.requires_grad])
    fwd, bwd = TPUGraph(), TPUGraph()
    with graph(fwd):
        static_outs, spec = _pytree.tree_flatten(fn(*args))
    static_grad_outs = [torch.zeros_like(o) if o.requires_grad else None for o in static_outs]
    with graph(bwd):
        grads = iter(grads_of(static_outs, [g for g in static_grad_outs if g is not None]))
    static_grads = [next(grads) if t.requires_grad else None for t in inputs]

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *given):
            for static, arg in zip(args, given):
                if arg is not static:
                    static.copy_(arg)
            fwd.replay()
            return tuple(o.detach() for o in static_outs)

        @staticmethod
        def backward(ctx, *grad_outs):
            for static, g in zip(static_grad_outs, grad_outs):
                if static is not None:
                    static.copy_(g) if g is not None else static.zero_()
            bwd.replay()
            return tuple(g.detach() if g is not None else None for g in static_grads)

    def run(*given):
        return _pytree.tree_unflatten(list(Graphed.apply(*given, *params)), spec)

    if module is None:
        return run
    training, original = module.training, module.forward

    def forward(*given):
        if module.training == training and torch.is_grad_enabled():
            return run(*given)
        return original(*given)

    module.forward = forward
    return module
