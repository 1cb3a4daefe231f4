"""`python -m torch_tpu demo`: train one small model on CPU and on tpu three ways, side by side.

The same random initial weights and the same synthetic token batches go to four copies of
the model, each running N AdamW steps in fp32: PyTorch's CPU eager (the reference), and on
tpu the two eager modes (Strict: each op runs at once; DeferAndFuse: ops are recorded and
run as fused graphs) and `torch.compile(backend="tpu")` with the optimizer step compiled
too. The copies take turns step by step, the order rotating, so load from elsewhere on the
machine slows all alike. The demo prints the loss curves and one table: each run's warm
throughput (the median step that built no program), its compile cost apart (the steps
that built programs, and their seconds), and each tpu run's largest relative loss
difference from CPU, which must stay within rtol for PASS.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

from .bench import common
from .bench import compile as bench_compile
from .workloads.models import MODELS

RUNS = {  # name -> TorchRunner arguments
    "CPU eager": {"device": "cpu"},
    "tpu Strict": {"device": "tpu", "mode": "strict"},
    "tpu DeferAndFuse": {"device": "tpu", "mode": "defer_and_fuse"},
    "tpu compiled": {"device": "tpu", "compile_backend": "tpu"},
}


HELP = "train a small Llama on CPU and on tpu (Strict, DeferAndFuse, compiled), check parity"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    p.add_argument("--model", choices=list(MODELS), default="llama",
                   help="the small HF Llama (default) or the nanoGPT-style GPT")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="largest allowed relative loss difference tpu vs CPU (default 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads for CPU eager (default 1: XLA:CPU runs these small "
                        "GEMMs on about one core, and on a loaded machine torch's thread team "
                        "stalls for tens of ms a step; 0: torch's own choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


class Run:
    """One copy of the model and its optimizer; each step is timed with a sync each side,
    and counts the programs it built (a step that built none is warm)."""

    def __init__(self, model, spec, base, **kw):
        self.runner = bench_compile.TorchRunner(base, spec, workload=bench_compile.TRAIN,
                                                model=model, **kw)
        self.on_tpu = kw["device"] == "tpu"
        self.losses: list[float] = []
        self.seconds: list[float] = []
        self.built: list[int] = []

    def step(self, batch) -> None:
        self.runner.sync()
        before = common.programs() if self.on_tpu else 0
        t0 = time.perf_counter()
        loss = self.runner.step(batch, bench_compile.TRAIN)
        self.runner.sync()
        self.seconds.append(time.perf_counter() - t0)
        self.built.append((common.programs() if self.on_tpu else 0) - before)
        self.losses.append(loss.item())

    def warm_ms(self) -> float | None:
        """The median step that built no program, in ms (None: every step built some)."""
        warm = [s for s, b in zip(self.seconds, self.built) if not b]
        return statistics.median(warm) * 1e3 if warm else None

    def cold(self) -> tuple[int, float]:
        """(steps that built programs, their seconds in all): the compile cost."""
        cold = [s for s, b in zip(self.seconds, self.built) if b]
        return len(cold), sum(cold)


def train(model, spec, base, batches, show_progress: bool) -> dict:
    from tqdm import tqdm

    import torch_tpu

    from torch_tpu import compile as tpu_compile

    tpu_compile.register()
    names = [n for n in RUNS
             if RUNS[n].get("mode") != "defer_and_fuse" or "DEFER_AND_FUSE" in torch_tpu.EagerMode.__members__]
    runs = {n: Run(model, spec, base, **RUNS[n]) for n in names}
    bar = tqdm(batches, desc="train " + " | ".join(names), unit="step", leave=False,
               disable=not show_progress, file=sys.stderr, dynamic_ncols=True)
    for i, batch in enumerate(bar):
        for n in names[i % len(names):] + names[:i % len(names)]:
            runs[n].step(batch)
        bar.set_postfix(cpu=f"{runs['CPU eager'].losses[-1]:.4f}")
    bar.close()
    return runs


def main(args) -> int:
    if args.steps < 2:
        print("demo: --steps must be at least 2 (the first step is timed apart)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model = MODELS[args.model]
    spec = dataclasses.replace(model.spec, seed=args.seed)
    base = model.build(spec)
    batches = model.batches(spec, args.steps)
    nparams = sum(p.numel() for p in base.parameters())
    print(f"{model.describe(spec)}, fp32; {nparams:,} parameters, {spec.tokens_per_step} "
          f"tokens/step, {args.steps} steps; CPU eager on {torch.get_num_threads()} thread(s)")
    print("XLA:CPU stands in for the accelerator here: tpu runs on this machine's CPU through "
          "PJRT, so tpu vs CPU shows torch_tpu's overhead beside PyTorch's CPU kernels, not TPU speed.")
    try:
        runs = train(model, spec, base, batches, show_progress=not args.no_progress)
    except NotImplementedError as e:
        print(f"demo: a tpu run stopped on an op torch_tpu cannot run yet:\n  "
              f"NotImplementedError: {e}", file=sys.stderr)
        return 3
    cpu = runs["CPU eager"]
    tpu = [n for n in runs if n != "CPU eager"]

    print("\nloss per step:")
    print(f"{'step':>4}  " + "  ".join(f"{n:>16}" for n in runs))
    for i in range(args.steps):
        print(f"{i + 1:4d}  " + "  ".join(f"{runs[n].losses[i]:16.6f}" for n in runs))

    def rel(n):
        return max(abs(t - c) / max(abs(c), 1e-12) for c, t in zip(cpu.losses, runs[n].losses))

    print("\nwarm: the median step that built no program (each step synchronized, the runs "
          "interleaved step by step);\ncompiling: the steps that built programs, how many and "
          f"their seconds in all;\nparity: largest relative loss difference from CPU eager, "
          f"rtol {args.rtol:g}:")
    print(f"  {'run':16}  {'warm tok/s':>10}  {'ms/step':>8}  {'vs CPU':>7}  {'compiling':>14}  "
          f"{'rel diff':>8}  parity")
    ok = True
    cpu_ms = cpu.warm_ms()
    for n, r in runs.items():
        check, verdict = "", ""
        if n != "CPU eager":
            d = rel(n)
            ok &= d <= args.rtol
            check, verdict = f"{d:8.1e}", "PASS" if d <= args.rtol else "FAIL"
        ms, (cold_steps, cold_s) = r.warm_ms(), r.cold()
        warm = (f"{spec.tokens_per_step * 1e3 / ms:10,.0f}  {ms:8.1f}  {cpu_ms / ms:6.2f}x"
                if ms else f"{'-':>10}  {'-':>8}  {'-':>7}")
        compiling = f"{cold_steps} in {cold_s:.2f}s" if cold_steps else "none"
        print(f"  {n:16}  {warm}  {compiling:>14}  {check:>8}  {verdict}")
    if any(r.warm_ms() is None for r in runs.values()):
        print("  (-: every step built programs; run more --steps for a warm figure)")
    print(f"\nparity of {', '.join(tpu)} vs CPU eager: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1
