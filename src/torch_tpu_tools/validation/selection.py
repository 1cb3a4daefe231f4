"""Top-k choices, recorded on CPU and taken again on tpu where they are equally valid.

A detector keeps the 300 or 900 best of about a thousand proposals (`torch.topk` over
their scores) and everything after depends on which ones and in what order. Where two
scores tie (padding proposals share one logit) or differ by less than float32's rounding,
CPU and tpu may each choose correctly and still choose differently: torch promises no
order among ties, on CUDA either. The rest of the model then runs on other rows, and its
output is far from CPU's although no op computed a wrong number (GroundingDINO: the same
900 proposals in another order; DEIMv2: other padding proposals at the cut).

So the CPU run records each top-k's indices, and the tpu run, at the same call, takes
CPU's indices instead of its own when they are a valid answer on tpu's own scores: the
scores they select equal tpu's top-k values within the forward tolerance. The values are
gathered from tpu's scores (gradients flow as through topk). A choice that is not a near
tie stays tpu's, and the mismatch it causes is reported. The number of choices taken is
reported with the result.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_TOPK = (torch.topk, torch.Tensor.topk)


def _dim(args, kwargs) -> int:
    return kwargs.get("dim", args[2] if len(args) > 2 else -1)


class Selections(TorchFunctionMode):
    """With `recorded` None, records each top-k's indices (`calls`); given the record of
    the same code's CPU run, aligns tpu's choices to it (`aligned` counts them)."""

    def __init__(self, recorded: list | None = None, tol: tuple[float, float] = (1e-3, 1e-4)):
        super().__init__()
        self.recorded, self.tol = recorded, tol
        self.calls: list[torch.Tensor] = []
        self.aligned = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in _TOPK:
            return out
        n = len(self.calls)
        self.calls.append(out.indices.detach().cpu())
        if self.recorded is None or n >= len(self.recorded):
            return out
        want = self.recorded[n]
        if want.shape != out.indices.shape or torch.equal(want, self.calls[n]):
            return out
        scores, dim = args[0], _dim(args, kwargs)
        idx = want.to(out.indices.device)
        taken = scores.gather(dim, idx)
        rtol, atol = self.tol
        ranked = taken.detach().sort(dim, descending=True).values  # (sorted=False too)
        best = out.values.detach().sort(dim, descending=True).values
        if not torch.allclose(ranked, best, rtol=rtol, atol=atol):
            return out  # not a near tie: tpu's scores differ, and the mismatch shows
        self.aligned += 1
        return torch.return_types.topk((taken, idx))


class _Nothing:
    """A run with no top-k to follow: no mode at all (torch.compile traces it unchanged)."""
    aligned = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def following(recorded: list | None, tol: tuple[float, float]):
    """The tpu run's aligner to CPU's `recorded` choices; a no-op where CPU made none."""
    return Selections(recorded, tol) if recorded else _Nothing()
