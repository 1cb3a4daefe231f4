"""`python -m torch_tpu bench shapes --clients`: real clients whose shapes vary
(workloads/clients.py), each run in a fresh process with an empty persistent compile cache,
in Strict, in DeferAndFuse and on CPU eager (the device hidden, a process of its own), one
after the other in one command. What a newcomer feels is the first step, compiles included,
so that is the first column; the ratios that say whether shape variety is solved compare a
run with itself padded to one length (Trainer), a warm step with CPU's (GRPO), and a long
sampling loop with a short one (generate).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

from ..workloads import clients
from . import common

VARIANTS = {"cpu": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "ACCELERATE_USE_CPU": "1"},
            "strict": {}, "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"}}
LABELS = {"cpu": "CPU eager", "strict": "Strict", "defer_and_fuse": "DeferAndFuse"}
CHART = "bench_shapes_clients.png"
TARGET_FIRST_STEP_S = 3.0   # small Llama's first training step, fresh process, empty cache
TARGET_PADDED_RATIO = 1.5   # Trainer, dynamic padding against padded to one length
TARGET_GRPO_RATIO = 1.5     # a warm GRPO step against CPU eager's
TARGET_GROWTH = 2.5         # generate: 128 tokens against 16, programs and compile seconds


def _spawn(name: str, variant: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_clients_") as cache:
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache, TORCH_TPU_RECOMPILE_WARN="0",
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), **VARIANTS[variant])
        cmd = [sys.executable, "-m", "torch_tpu_tools.workloads.clients", name,
               "cpu" if variant == "cpu" else "tpu"]
        return common.run_child(cmd, env, timeout)


def measure(names, variants, timeout: float) -> dict:
    """{client: {variant: result}}, every client in every variant, one process each."""
    out = {n: {} for n in names}
    with common.progress(len(names) * len(variants), "bench shapes --clients") as bar:
        for name in names:
            for variant in variants:
                bar.set_description(f"bench shapes --clients: {name}, {LABELS[variant]}")
                out[name][variant] = _spawn(name, variant, timeout)
                bar.update(1)
    return out


def _s(r: dict, key: str) -> str:
    if "error" in r:
        return f"({r['error']})"
    v = r.get(key)
    return "" if v is None else f"{v:.2f}"


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _x(v: float | None, target: float | None = None) -> str:
    if v is None:
        return "n/a"
    miss = "" if target is None or v <= target else " (miss)"
    return f"**{v:.2f}x**{miss}"


def render(res: dict, variants, seconds: float) -> str:
    tpu = [v for v in variants if v != "cpu"]
    header = ["client", "CPU first s", *[f"{LABELS[v]} first s" for v in tpu],
              *[f"{LABELS[v]} first / CPU" for v in tpu], "CPU warm s",
              *[f"{LABELS[v]} warm s" for v in tpu], *[f"{LABELS[v]} programs" for v in tpu],
              *[f"{LABELS[v]} after warm-up" for v in tpu]]
    rows = []
    for name, by in res.items():
        cpu = by.get("cpu", {})
        rows.append([name, _s(cpu, "first_s"), *[_s(by[v], "first_s") for v in tpu],
                     *[_x(_ratio(by[v].get("first_s"), cpu.get("first_s"))) for v in tpu],
                     _s(cpu, "warm_s"), *[_s(by[v], "warm_s") for v in tpu],
                     *[str(by[v].get("programs", "")) for v in tpu],
                     *[str(by[v].get("late_programs", "")) for v in tpu]])
    text = [common.markdown_table(header, rows), "", _targets(res, tpu),
            f"\nWhole run: {seconds:.0f} s, each client and mode in a fresh process with an "
            "empty compile cache. `first` is the first training step or the whole sampling "
            "call, compiles included; `warm` the median step that built no program; "
            "`after warm-up` the programs built after the warm-up (Trainer: the second "
            "epoch; GRPO: from step 3)."]
    return "\n".join(text)


def _targets(res: dict, tpu) -> str:
    """One line per target whose clients ran."""
    lines = []
    for v in tpu:
        label = LABELS[v]
        if "trainer" in res and "trainer_max" in res:
            dyn, pad = res["trainer"][v], res["trainer_max"][v]
            ratio = _ratio(dyn.get("wall_s"), pad.get("wall_s"))
            lines.append(f"- {label}: Trainer with dynamic padding / padded to one length, "
                         f"wall time: {_x(ratio, TARGET_PADDED_RATIO)} (≤ {TARGET_PADDED_RATIO}x;"
                         f" {_s(dyn, 'wall_s')} s against {_s(pad, 'wall_s')} s); programs "
                         f"in the second epoch: {dyn.get('late_programs', 'n/a')} (target 0)")
        if "grpo" in res:
            g, gc = res["grpo"][v], res["grpo"].get("cpu", {})
            lines.append(f"- {label}: GRPO warm step / CPU eager's: "
                         f"{_x(_ratio(g.get('warm_s'), gc.get('warm_s')), TARGET_GRPO_RATIO)} "
                         f"(≤ {TARGET_GRPO_RATIO}x); programs from step 3: "
                         f"{g.get('late_programs', 'n/a')} (target 0)")
        if "generate16" in res and "generate128" in res:
            a, b = res["generate16"][v], res["generate128"][v]
            lines.append(f"- {label}: nanoGPT generate, 128 tokens against 16 (≤ "
                         f"{TARGET_GROWTH}x): programs "
                         f"{_x(_ratio(b.get('programs'), a.get('programs')), TARGET_GROWTH)} "
                         f"({b.get('programs', 'n/a')} against {a.get('programs', 'n/a')}), "
                         f"compile seconds "
                         f"{_x(_ratio(b.get('compile_s'), a.get('compile_s')), TARGET_GROWTH)} "
                         f"({_s(b, 'compile_s')} against {_s(a, 'compile_s')})")
        if "first_step" in res:
            f = res["first_step"][v]
            ok = "n/a" if "first_s" not in f else (
                "met" if f["first_s"] <= TARGET_FIRST_STEP_S else "miss")
            lines.append(f"- {label}: first training step of the small Llama (hidden 128, 4 "
                         f"layers): {_s(f, 'first_s')} s (≤ {TARGET_FIRST_STEP_S:.0f} s: {ok})")
    return "Targets:\n" + "\n".join(lines) if lines else ""


def chart(res: dict, variants, path) -> None:
    names = list(res)
    series = {LABELS[v]: [res[n].get(v, {}).get("first_s", float("nan")) for n in names]
              for v in variants}
    common.bar_chart(path, "First step (compiles included), fresh process", names, series,
                     "seconds (log scale)")


def main(args) -> int:
    names = [n for n in args.clients.split(",") if n] if args.clients != "all" \
        else list(clients.NAMES)
    variants = ["cpu"] + [m for m in args.modes.split(",") if m in VARIANTS]
    t0 = time.perf_counter()
    res = measure(names, variants, args.client_timeout)
    text = render(res, variants, time.perf_counter() - t0) + "\n\n" + common.notes(
        args.out, "shapes_clients")
    print(text)
    if not args.no_write:
        common.publish(args.out, "shapes_clients", "Shapes: real clients whose shapes vary "
                       "(first step, padding, RL, sampling)", text,
                       {CHART: lambda path: chart(res, variants, path)})
    return 0
