"""`bench compile`'s report: the tables, the targets against jax.jit, the notes
(OUT/bench_notes/compile.md) and the chart. bench/compile.py measures; this module only
formats what it measured (a `Result` per model and workload, keyed by the model)."""
from __future__ import annotations

import math

from . import common

TRAIN, INFER = "train", "infer"


def _fmt(x, digits=2):
    return "n/a" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def _ratio(num, den, fmt="{:.2f}x"):
    return fmt.format(num / den) if num and den else "n/a"


def _rel_diff(res, name: str) -> float | None:
    ref, got = res.losses.get("CPU eager"), res.losses.get(name)
    return None if ref is None or got is None else max(
        abs(g - r) / max(abs(r), 1e-12) for g, r in zip(got, ref))


def table(results: dict) -> str:
    """One model's table: a row per contestant, a group of columns per workload."""
    names = []
    for r in results.values():
        names += [n for n in list(r.first_s) + list(r.errors) if n not in names]
    header = ["contestant"]
    for w in results:
        header += [f"{w} ms", f"{w} vs CPU eager", f"{w} vs jax.jit", f"{w} first step s",
                   f"{w} first step / jax.jit's", f"{w} vs CPU, rel diff"]
    rows = []
    for n in names:
        row = [n]
        for r in results.values():
            if n in r.errors:
                row += ["error", "—", "—", r.errors[n].replace("|", "\\|"), "—", "—"]
                continue
            ms, cpu, jit = r.ms.get(n), r.ms.get("CPU eager"), r.ms.get("jax.jit")
            rel = _rel_diff(r, n)
            row += [_fmt(ms), _ratio(cpu, ms), _ratio(jit, ms), _fmt(r.first_s.get(n), 1),
                    _ratio(r.first_s.get(n), r.first_s.get("jax.jit"), "{:.1f}x"),
                    "n/a" if rel is None else f"{rel:.0e}"]
        rows.append(row)
    return common.markdown_table(header, rows)


PHASES = ("upload", "forward", "backward", "opt.step", "zero_grad", "step", "wait", "total",
          "programs/step", "Strict ops/step")


def phase_table(res) -> str:
    names = list(res.phases)
    keys = [k for k in PHASES if any(k in res.phases[n] for n in names)]
    rows = [[k] + [_fmt(res.phases[n][k], 1 if k.endswith("/step") else 2)
                   if k in res.phases[n] else "—" for n in names] for k in keys]
    return common.markdown_table(["phase, ms"] + names, rows)


def targets(model, results: dict) -> list[str]:
    out = []
    tr, inf = results.get(TRAIN), results.get(INFER)
    c = "tpu compiled"
    for res, versus, ref, goal in ((tr, "training, compiled vs hand-written", "jax.jit", 0.9),
                                   (tr, "training, compiled vs native", "CPU eager", 1.1),
                                   (inf, "inference, compiled vs", "jax.jit", 1.0)):
        if res is not None and c in res.ms and ref in res.ms:
            ratio = res.ms[ref] / res.ms[c]
            out.append(f"- {model.name} {versus} {ref}: **{ratio:.2f}x** "
                       f"(target ≥ {goal}x: {'met' if ratio >= goal else 'not met'})")
    cold = tr.cold if tr is not None else {}
    if cold.get(c) and cold.get("jax.jit"):
        ratio = cold[c] / cold["jax.jit"]
        line = (f"- {model.name} first training step, each in a fresh process, compiled vs "
                f"jax.jit: **{ratio:.1f}x** as long ({cold[c]:.1f} s vs {cold['jax.jit']:.1f} s; "
                f"target ≤ 3x: {'met' if ratio <= 3 else 'not met'})")
        if cold.get("CPU aot_eager"):
            floor = cold["CPU aot_eager"]
            line += (f"; torch's own tracing, `backend=\"aot_eager\"` on CPU, took {floor:.1f} s, "
                     f"{floor / cold['jax.jit']:.1f}x jax.jit's: the floor behind torch.compile")
        out.append(line)
    if tr is not None and (rel := _rel_diff(tr, "jax.jit")) is not None:
        out.append(f"- {model.name} parity of the hand-written JAX step: loss vs torch CPU eager at "
                   f"steps 1 and 3, rel diff {rel:.0e} (tolerance 1e-4: "
                   f"{'ok' if rel <= 1e-4 else 'MISMATCH'})")
    return out


def render(by_model: dict, rounds: int, load_start: str, notes: str = "") -> str:
    """The section's markdown; `notes`: the bench's hand-written reading (common.notes)."""
    lines = [
        (f"Median ms per step over {rounds} interleaved rounds (one step each, synchronized); "
        "*vs X* is X's time / this one's (higher is faster). The first step includes every "
        "compile, with no persistent cache (a fresh temporary TORCH_TPU_CACHE_DIR); *first "
        "step / jax.jit's* is its time over jax.jit's first step (lower is better); in the "
        "table the contestants share one process, in this order (the first pays torch's and "
        "jax's one-time setup), so the first-step targets below time each contestant's "
        "first step in a fresh process of its own instead. *vs CPU, "
        "rel diff* is the largest relative difference from CPU eager's loss (inference: the "
        "mean of the output) at steps 1 and 3. Training is forward + backward + AdamW, "
        "inference the forward pass under no_grad, fp32. *tpu compiled* compiles the model "
        "and `opt.step` with backend=\"tpu\" (dynamo then keeps the AdamW state on the "
        "device, `capturable=True`, as it does for CUDA); *CPU inductor* compiles both with "
        "inductor. Inference runs after training in the same process, so its first steps "
        "find the eager modes' per-op executables already built. "
        f"Load average at the start: {load_start}."),
        "",
        "![compiled vs eager vs jax.jit](bench_compile.png)",
        "",
    ]
    goals = []
    for model, results in by_model.items():
        lines += [f"### {model.name}", "", model.describe(model.spec) + ".", "",
                  table(results), ""]
        tr = results.get(TRAIN)
        if tr is not None and tr.phases:
            lines += [("One training step phase by phase, median ms, with the programs run "
                       "and the Strict ops dispatched per step. Plain columns: nothing "
                       "synchronized in between, so a phase is its host work (Python, "
                       "dispatch, and what a dispatch waits for itself, such as buffers it "
                       "donates that a running program still reads) and *wait* the final "
                       "sync; *synced*: a sync after each phase, which then holds its device "
                       "work too:"), "", phase_table(tr), ""]
        goals += targets(model, results)
    if goals:
        lines += ["### Targets", ""] + goals + [""]
    lines += [notes]
    return "\n".join(lines)


def chart(by_model: dict, path) -> None:
    groups, names = [], []
    for model, results in by_model.items():
        for w, r in results.items():
            groups.append(f"{model.name} {w}")
            names += [n for n in r.ms if n not in names]
    series = {n: [r.ms.get(n, float("nan")) for results in by_model.values()
                  for r in results.values()] for n in names}
    common.bar_chart(path, "ms per step (median, lower is better)", groups, series, "ms per step")
