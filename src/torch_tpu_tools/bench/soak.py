"""`python -m torch_tpu bench soak`: does a long run keep its memory and its programs flat?

The small Llama of `bench modes` trains for `--steps` steps (AdamW, `loss.item()` every
step) and greedy-generates every `--generate-every` steps, training and generation in one
process as RL and evaluation loops do. Each variant (Strict, DeferAndFuse, compiled
`torch.compile(backend="tpu")`, CPU eager) runs in its own fresh process, so one's memory
is not another's. Every `--every` steps the child samples its resident set size (RSS),
the device bytes allocated (`torch.tpu.memory_allocated()`), the programs compiled so far
and the objects Python's GC tracks.

Reported, per variant, from the first sample after warm-up (the step given by `--warm`)
to the last: the growth of RSS, of device bytes and of tracked objects, the programs
compiled after warm-up (expected: none), and the losses' agreement with CPU eager. A plot
of RSS against step goes beside the report, which is written into the Soak section of
OUT/RELIABILITY.md (`--out`, default ./docs).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

import torch

from ..workloads import decoder
from . import common
from .modes import SPEC, Runner
from .modes_types import INFER, LABELS, TRAIN

VARIANTS = ("strict", "defer_and_fuse", "compiled", "cpu")
_LABELS = {**LABELS, "compiled": "compiled (tpu)"}
PLOT = "soak_rss.png"
# flat: growth after warm-up within these bounds over the whole run
MAX_RSS_GROWTH_MB = 64.0
MAX_OBJECT_GROWTH = 5000


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _sample(step: int, tpu: bool) -> dict:
    gc.collect()
    return {"step": step, "rss_mb": _rss_mb(), "objects": len(gc.get_objects()),
            "device_bytes": torch.tpu.memory_allocated() if tpu else 0,
            "programs": common.programs() if tpu else 0}


def child(variant: str, steps: int, every: int, generate_every: int) -> dict:
    """One variant's soak in this process -> its samples and losses (run by `main`)."""
    base = decoder.build_model(SPEC)
    mode = "strict" if variant == "compiled" else variant
    trainer = Runner(base, SPEC, mode, TRAIN)
    generator = Runner(base, SPEC, mode, INFER)
    if variant == "compiled":
        trainer.model = torch.compile(trainer.model, backend="tpu")
    tpu = trainer.tpu
    samples, outputs = [], []
    bar = common.progress(steps, f"soak {variant}")
    bar.unit = "step"
    for step in range(1, steps + 1):
        trainer.run()
        if step % generate_every == 0:
            generator.run()
            outputs.append(generator.output.flatten().tolist())
        if step % every == 0 or step == 1:
            samples.append(_sample(step, tpu))
        bar.update(1)
    bar.close()
    return {"variant": variant, "samples": samples, "losses": trainer.losses,
            "generated": outputs}


def _run_child(variant: str, args) -> dict:
    cmd = [sys.executable, "-m", "torch_tpu", "bench", "soak", "--child", variant,
           "--steps", str(args.steps), "--every", str(args.every),
           "--generate-every", str(args.generate_every)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"soak {variant}: the child process failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(run: dict, warm: int, cpu_losses) -> dict:
    """Growth from the first sample at or after step `warm` to the last sample."""
    samples = run["samples"]
    first = next(s for s in samples if s["step"] >= warm)
    last = samples[-1]
    losses = run["losses"]
    worst = max((abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, cpu_losses)),
                default=0.0)
    return {"variant": run["variant"], "from": first["step"], "to": last["step"],
            "rss_start": first["rss_mb"], "rss_growth": last["rss_mb"] - first["rss_mb"],
            "device_growth": last["device_bytes"] - first["device_bytes"],
            "device_end": last["device_bytes"],
            "object_growth": last["objects"] - first["objects"],
            "programs_after_warm": last["programs"] - first["programs"],
            "loss_rel_diff": worst, "loss_end": losses[-1]}


def flat(s: dict) -> bool:
    return (s["rss_growth"] <= MAX_RSS_GROWTH_MB and s["device_growth"] <= 0
            and s["object_growth"] <= MAX_OBJECT_GROWTH and s["programs_after_warm"] == 0)


def report(summaries: list[dict], args) -> str:
    rows = [[_LABELS[s["variant"]], f"{s['from']}-{s['to']}", f"{s['rss_start']:.0f}",
             f"{s['rss_growth']:+.1f}", f"{s['device_end'] / 2**20:.2f}",
             f"{s['device_growth'] / 2**20:+.2f}", f"{s['object_growth']:+d}",
             s["programs_after_warm"], f"{s['loss_rel_diff']:.1e}",
             "yes" if flat(s) else "**no**"] for s in summaries]
    table = common.markdown_table(
        ["variant", "steps", "RSS at start (MB)", "RSS growth (MB)", "device MB at end",
         "device growth (MB)", "GC objects growth", "programs compiled after warm-up",
         "worst loss rel. diff vs CPU", "flat"], rows)
    return (f"{SPEC.describe()}. {args.steps} training steps, a greedy generate every "
            f"{args.generate_every} steps, sampled every {args.every} steps; growth is "
            f"measured from step {args.warm} (after warm-up) to the end, each variant in its "
            f"own process. Flat means: RSS within +{MAX_RSS_GROWTH_MB:.0f} MB, device bytes "
            f"not growing, at most {MAX_OBJECT_GROWTH} more GC-tracked objects, and no "
            f"program compiled after warm-up.\n\n{table}\n\n![RSS against step]"
            f"({PLOT})\n")


def plot(runs: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        xs = [s["step"] for s in run["samples"]]
        ax.plot(xs, [s["rss_mb"] for s in run["samples"]], label=_LABELS[run["variant"]])
    ax.set_xlabel("training step")
    ax.set_ylabel("resident set size (MB)")
    ax.set_title("soak: RSS of each variant's process")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=1000, help="training steps per variant")
    p.add_argument("--every", type=int, default=50, help="steps between memory samples")
    p.add_argument("--warm", type=int, default=100, help="growth is measured from this step")
    p.add_argument("--generate-every", type=int, default=25,
                   help="steps between greedy generate calls")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    common.add_output_arguments(p, "RELIABILITY.md and the plot")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)


def main(args) -> int:
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.every, args.generate_every)))
        return 0
    runs = [_run_child(v, args) for v in args.variants]
    cpu = next((r for r in runs if r["variant"] == "cpu"), None)
    summaries = [summarize(r, args.warm, cpu["losses"] if cpu else r["losses"]) for r in runs]
    body = report(summaries, args)
    print(body)
    if not args.no_write:
        common.publish(args.out, "soak", "Soak", body, {PLOT: lambda path: plot(runs, path)},
                       md="RELIABILITY.md")
    return 0 if all(flat(s) for s in summaries) else 1

