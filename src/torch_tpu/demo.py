"""`python -m torch_tpu demo`: train a small Llama on tpu and on CPU side by side.

The same random initial weights and the same synthetic token batches go to both devices;
each runs N AdamW steps in fp32. The demo prints both loss curves, tokens/s for the
steady steps (the first tpu step compiles every op, so it is timed on its own), and the
largest relative loss difference, which must stay within rtol for PASS.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from . import metrics
from .bench import llama


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=20, help="training steps per device (default 20)")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="largest allowed relative loss difference tpu vs CPU (default 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


class Trainer:
    """One device's copy of the model and optimizer; `step` is timed with a sync each side."""

    def __init__(self, spec: llama.LlamaSpec, base: torch.nn.Module, device: str):
        self.device = device
        self.model = llama.replicate(base, device)
        self.opt = llama.make_optimizer(self.model, spec)
        self.losses: list[float] = []
        self.seconds: list[float] = []

    def step(self, ids: torch.Tensor) -> None:
        ids = ids.to(self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        loss = llama.train_step(self.model, self.opt, ids)
        _sync(self.device)
        self.seconds.append(time.perf_counter() - t0)
        self.losses.append(loss.item())


def train(spec: llama.LlamaSpec, base: torch.nn.Module, batches,
          show_progress: bool) -> tuple[Trainer, Trainer]:
    """The same steps on CPU and tpu, interleaved step by step (the order alternating) so
    that load from elsewhere on the machine slows both alike."""
    from tqdm import tqdm

    cpu, tpu = Trainer(spec, base, "cpu"), Trainer(spec, base, "tpu")
    bar = tqdm(batches, desc="train cpu+tpu", unit="step", leave=False,
               disable=not show_progress, file=sys.stderr, dynamic_ncols=True)
    for i, ids in enumerate(bar):
        for trainer in ((cpu, tpu) if i % 2 == 0 else (tpu, cpu)):
            trainer.step(ids)
        bar.set_postfix(cpu=f"{cpu.losses[-1]:.4f}", tpu=f"{tpu.losses[-1]:.4f}")
    bar.close()
    return cpu, tpu


def _throughput(spec, seconds) -> str:
    steady = seconds[1:] or seconds
    return f"{spec.tokens_per_step * len(steady) / sum(steady):10,.0f} tokens/s"


def main(args) -> int:
    if args.steps < 2:
        print("demo: --steps must be at least 2 (the first step is timed apart)", file=sys.stderr)
        return 2
    spec = llama.LlamaSpec(seed=args.seed)
    base = llama.build_model(spec)
    batches = llama.make_batches(spec, args.steps)
    nparams = sum(p.numel() for p in base.parameters())
    print(f"Llama: hidden {spec.hidden}, {spec.layers} layers, {spec.heads} heads, vocab "
          f"{spec.vocab}, {nparams:,} parameters; batch {spec.batch} x seq {spec.seq} "
          f"= {spec.tokens_per_step} tokens/step; AdamW lr {spec.lr}, fp32, {args.steps} steps")
    metrics.reset()
    try:
        cpu, tpu = train(spec, base, batches, show_progress=not args.no_progress)
    except NotImplementedError as e:
        print(f"demo: the tpu run stopped on an op torch_tpu cannot run yet:\n  "
              f"NotImplementedError: {e}", file=sys.stderr)
        return 3
    compiled = metrics.counters.get("executables_compiled", 0)
    cpu_losses, cpu_s, tpu_losses, tpu_s = cpu.losses, cpu.seconds, tpu.losses, tpu.seconds

    rel = [abs(t - c) / max(abs(c), 1e-12) for c, t in zip(cpu_losses, tpu_losses)]
    print(f"\n{'step':>4}  {'CPU loss':>10}  {'tpu loss':>10}  {'rel diff':>9}")
    for i, (c, t, r) in enumerate(zip(cpu_losses, tpu_losses, rel), 1):
        print(f"{i:4d}  {c:10.6f}  {t:10.6f}  {r:9.2e}")

    print(f"\nthroughput, steps 2..{args.steps} (each step synchronized; CPU and tpu steps "
          "interleaved):")
    print(f"  CPU eager   {_throughput(spec, cpu_s)}   ({sum(cpu_s[1:]) / (len(cpu_s) - 1) * 1e3:8.1f} ms/step)")
    print(f"  tpu Strict  {_throughput(spec, tpu_s)}   ({sum(tpu_s[1:]) / (len(tpu_s) - 1) * 1e3:8.1f} ms/step)")
    print(f"first step: CPU {cpu_s[0] * 1e3:.0f} ms, tpu {tpu_s[0]:.2f} s (the tpu run compiled "
          f"{compiled} executables, nearly all of them in its first step)")

    worst = max(rel)
    ok = worst <= args.rtol
    print(f"\nparity: max relative loss difference {worst:.2e} "
          f"(rtol {args.rtol:g}) -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1
