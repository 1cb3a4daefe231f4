"""One training step of a zoo model, and how tpu's step is judged (issue 54).

The step is what a user's loop does once: forward, the loss, backward, one AdamW step.
The loss is the head's own, with labels made to fit (the ids for language-model heads, a
class per row for classifiers); a head without one (a base model) takes a fixed random
projection of its main output, summed, so that every gradient carries signal (a plain sum
of a normalized output has gradients that are only rounding noise). Models run in eval
mode: dropout would draw different numbers on each device.

The judge is PyTorch's own for backends (torch._dynamo.utils.same with a float64
reference, as its benchmark accuracy checks run it): the same step runs on CPU in float32
and in float64, and a tpu tensor fails only when its RMSE from the float64 result exceeds
MULTIPLIER times CPU float32's own RMSE from it, plus TOL / 10 (tolerances.py). The output,
the loss, every gradient and every parameter after the step are judged (a projection
loss may also be as far as tpu's output error implies: `_implied`); a parameter
only where the gradients carry signal (each within half of float64's): AdamW's first step
moves an element by about lr times its gradient's sign, so a gradient that is rounding
noise flips it on any device. A model that cannot run in float64 on CPU is judged against
CPU float32 with the fixed model tolerances (tolerances.py), by the same rule.
"""
from __future__ import annotations

import copy

import torch

from . import compare, tolerances

LR = 1e-3
ADAM_EPS = 1e-8  # AdamW's default


def labels(task: str, config, kw: dict) -> dict:
    """Keyword arguments that make the head compute its own loss ({} for none)."""
    ids = kw.get("input_ids")
    if task in ("causal-lm", "masked-lm") and ids is not None:
        return {"labels": ids}
    if task in ("seq-cls", "image-cls"):
        n = int(getattr(config, "num_labels", 2) or 2)
        rows = next(v for v in kw.values() if isinstance(v, torch.Tensor)).shape[0]
        return {"labels": torch.arange(rows) % n}
    return {}


def projection(out: torch.Tensor) -> torch.Tensor:
    """The fixed weights of a head without a loss: loss = (out * w).sum()."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(out.shape, generator=g, dtype=torch.float64)


def step(model, kw: dict, label_kw: dict, main_output, run=None) -> dict:
    """forward, loss, backward, AdamW: every value a user would look at, on CPU.
    `run` calls the model (a torch.compile'd one); the parameters are `model`'s."""
    run = model if run is None else run
    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                            eps=ADAM_EPS)
    result = run(**kw, **label_kw)
    _, out = main_output(result)
    projected = not (label_kw and getattr(result, "loss", None) is not None)
    loss = (out * projection(out).to(out.device, out.dtype)).sum() if projected else result.loss
    loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    opt.step()
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()
              if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return {"out": out.detach().cpu().clone(), "loss": loss.detach().cpu().clone(),
            "grads": grads, "params": params, "projected": projected}


def in_float64(model, kw: dict):
    """(a float64 copy of `model`, the inputs with their floating tensors in float64)."""
    wide = copy.deepcopy(model).to(torch.float64)
    if getattr(wide.config, "_experts_implementation", None) == "grouped_mm":
        # CPU's grouped_mm takes no float64: the same experts, one matmul each
        wide.set_experts_implementation("eager")
    return wide, {k: v.to(torch.float64) if isinstance(v, torch.Tensor) and
                  v.is_floating_point() else v for k, v in kw.items()}


def _rmse(ref: torch.Tensor, x: torch.Tensor) -> float:
    return float((ref.double() - x.double()).pow(2).mean().sqrt())


def judged(wide: torch.Tensor, cpu: torch.Tensor, tpu: torch.Tensor, what: str) -> str | None:
    """None when tpu's value is as close to float64's as CPU float32's is (module doc)."""
    if tuple(tpu.shape) != tuple(cpu.shape) or tpu.dtype != cpu.dtype:
        return compare.tensor_close(cpu, tpu, 0.0, 0.0, what)
    if cpu.numel() == 0 or not cpu.is_floating_point():
        return compare.tensor_close(cpu, tpu, 0.0, 0.0, what)
    bad = torch.isnan(tpu) & ~torch.isnan(cpu)
    if bool(bad.any()):
        return f"{what}: {int(bad.sum())} NaN where CPU has none"
    keep = torch.isfinite(wide) & torch.isfinite(cpu) & torch.isfinite(tpu)
    w, c, t = wide[keep], cpu[keep], tpu[keep]
    if w.numel() == 0:
        return None
    ref, res = _rmse(w, c), _rmse(w, t)
    mult = tolerances.F64_MULTIPLIER_SMALL if cpu.numel() < 1000 else \
        tolerances.F64_MULTIPLIER
    # dynamo's floor is absolute, for values of order 1; a larger value (a summed loss)
    # gets it relative to its size
    floor = tolerances.F64_TOL / 10 * max(1.0, float(w.double().pow(2).mean().sqrt()))
    if res <= mult * ref + floor:
        return None
    return (f"{what}: RMSE from float64 {res:.3g}, CPU float32's {ref:.3g} "
            f"(allowed {mult:g}x + {floor:.3g})")


def _implied(cpu: dict, tpu: dict, wide: dict) -> bool:
    """Whether a projection loss's error from float64 is what tpu's output error implies.
    The loss is (out * w).sum(), linear in the output, which is judged itself: by
    Cauchy-Schwarz its error is at most |w| |out - out64| (plus the sum's rounding, within
    CPU's own allowance). A single sum of ~n errors of either sign is one draw, so the
    multiplier rule alone, against CPU's one draw, fails outputs that pass (GLM-4V-MoE's
    text model in DeferAndFuse: output within 1.2x of CPU's RMSE, summed loss 13x)."""
    w = projection(wide["out"])
    if tuple(w.shape) != tuple(tpu["out"].shape):
        return False
    bound = float(w.norm()) * float((tpu["out"].double() - wide["out"]).norm())
    room = float((cpu["loss"].double() - wide["loss"]).abs())
    err = float((tpu["loss"].double() - wide["loss"]).abs())
    return err <= bound + tolerances.F64_MULTIPLIER_SMALL * room


def _signal(grads: list, wide_grad) -> torch.Tensor | None:
    """Where every gradient agrees with float64's within half of it, and is well above
    AdamW's eps: elsewhere the gradient is rounding noise, and AdamW's first step, about
    lr times its sign, may go either way on any device; or the gradient is near eps
    (Autoformer's value biases, whose gradients cancel to ~1e-8), where the step is lr
    times g / (|g| + eps) and turns a gradient difference of 1e-9 into one of lr / 10."""
    if wide_grad is None or any(g is None or g.shape != wide_grad.shape for g in grads):
        return None
    ok = wide_grad.double().abs() >= 100 * ADAM_EPS
    for g in grads:
        ok &= (g.double() - wide_grad.double()).abs() <= 0.5 * wide_grad.double().abs()
    return ok


def compare_steps(cpu: dict, tpu: dict, wide: dict | None) -> str | None:
    """The first value of tpu's step that fails its judge (module doc), or None."""
    if set(cpu["params"]) != set(tpu["params"]):
        return f"different parameters: {sorted(set(cpu['params']) ^ set(tpu['params']))[:3]}"
    # a gradient of zeros where the other side has none: compiled steps (AOTAutograd, on
    # CPU as well) give zeros to parameters the loss does not reach, eager gives None, and
    # AdamW then applies its weight decay to one side only: such parameters are torch's
    one_side = {n: (cpu["grads"] | tpu["grads"])[n] for n in set(cpu["grads"]) ^ set(tpu["grads"])}
    if any(bool(g.any()) for g in one_side.values()):
        return f"gradients for different parameters: {sorted(one_side)[:3]}"
    pairs = [("out", cpu["out"], tpu["out"], None if wide is None else wide["out"]),
             ("loss", cpu["loss"], tpu["loss"], None if wide is None else wide["loss"])]
    for key in ("grads", "params"):
        pairs += [(f"{key[:-1]} {n}", cpu[key][n], tpu[key][n],
                   None if wide is None else wide[key][n])
                  for n in cpu[key] if n in tpu[key] and n not in one_side]
    for what, c, t, w in pairs:
        if what.startswith("param "):  # judged where the gradients carry signal
            name = what[6:]
            grads = [cpu["grads"].get(name), tpu["grads"].get(name)]
            keep = _signal(grads, grads[0] if w is None else wide["grads"].get(name))
            if keep is not None:
                c, t, w = c[keep], t[keep], None if w is None else w[keep]
        if w is not None and what == "loss" and tpu["projected"] and _implied(cpu, tpu, wide):
            reason = None
        elif w is not None:
            reason = judged(w, c, t, what)
        else:
            rtol, atol = tolerances.MODEL_LOGITS if what in ("out", "loss") else \
                tolerances.MODEL_GRADS
            reason = compare.tensor_close(c, t, rtol, atol, what)
        if reason:
            return reason
    return None
