"""The report of `bench scaling` (scaling.py measures): the tables of ms and ratios, where
each mode crosses CPU eager along FLOPs per call, the plot, and the notes of what was
measured about it. A cell is scaling.Cell: workload, width, batch, seq, flops, ms, errors,
disagree and ratio(name, ref)."""
from __future__ import annotations

import itertools
import math

from . import common
from .compile import TRAIN

SHORT = {"tpu Strict": "Strict", "tpu DeferAndFuse": "DeferAndFuse", "tpu compiled": "compiled",
         "CPU eager": "CPU eager", "CPU inductor": "inductor", "jax.jit": "jax.jit"}
TARGET_DEFER_VS_STRICT, TARGET_DEFER_VS_CPU, TARGET_WIDTH = 1.5, 1.0, 512


def crossings(points):
    """Where a ratio crosses 1 along FLOPs: [(flops, direction, (lo cell, hi cell))], the
    crossing interpolated in log-log between neighbouring cells."""
    out = []
    for (f1, r1, c1), (f2, r2, c2) in itertools.pairwise(points):
        if (r1 - 1) * (r2 - 1) < 0:
            t = -math.log(r1) / (math.log(r2) - math.log(r1))
            f = math.exp(math.log(f1) + t * (math.log(f2) - math.log(f1)))
            out.append((f, "above" if r2 > 1 else "below", (c1, c2)))
    return out


def _cell_name(c) -> str:
    return f"width {c.width}, {c.batch}x{c.seq}"


def _gflop(f: float) -> str:
    return f"{f / 1e9:.3g}"


def summary(cells, names) -> list[str]:
    lines = []
    for w in dict.fromkeys(c.workload for c in cells):
        rows = sorted((c for c in cells if c.workload == w), key=lambda c: c.flops)
        lines.append(f"**{w}**:")
        for n in names:
            if n == "CPU eager":
                continue
            pts = [(c.flops, c.ratio(n, "CPU eager"), c) for c in rows if c.ratio(n, "CPU eager") > 0]
            if not pts:
                lines.append(f"- {n}: no measurement")
                continue
            xs = crossings(pts)
            best = max(pts, key=lambda p: p[1])
            worst = min(pts, key=lambda p: p[1])
            if xs:
                said = "; ".join(f"crosses {d} CPU eager at ≈{_gflop(f)} GFLOP/call (between "
                                 f"{_cell_name(a)} and {_cell_name(b)})" for f, d, (a, b) in xs)
            elif worst[1] >= 1:
                said = f"faster than CPU eager at every size (least {worst[1]:.2f}x, {_cell_name(worst[2])})"
            else:
                said = f"slower than CPU eager at every size (best {best[1]:.2f}x, {_cell_name(best[2])})"
            jit = [c.ratio(n, "jax.jit") for c in rows if c.ratio(n, "jax.jit") > 0]
            if n != "jax.jit" and jit:
                said += (f"; vs jax.jit {min(jit):.2f}x-{max(jit):.2f}x "
                         f"(median {common.median(jit):.2f}x)")
            lines.append(f"- {n}: {said}")
        lines.append("")
    tr = [c for c in cells if c.workload == TRAIN and c.width <= TARGET_WIDTH]
    dvs = [(c, c.ratio("tpu DeferAndFuse", "tpu Strict"), c.ratio("tpu DeferAndFuse", "CPU eager"))
           for c in tr if c.ms.get("tpu DeferAndFuse")]
    if dvs:
        ok = all(a >= TARGET_DEFER_VS_STRICT and b >= TARGET_DEFER_VS_CPU for _, a, b in dvs)
        lines.append(f"DeferAndFuse, training, widths ≤ {TARGET_WIDTH} (target ≥ "
                     f"{TARGET_DEFER_VS_STRICT}x Strict and ≥ {TARGET_DEFER_VS_CPU}x CPU eager): "
                     + ("**met** at every cell." if ok else "**not met** at " + ", ".join(
                         f"{_cell_name(c)} ({a:.2f}x Strict, {b:.2f}x CPU)" for c, a, b in dvs
                         if a < TARGET_DEFER_VS_STRICT or b < TARGET_DEFER_VS_CPU) + "."))
    return lines


def tables(cells, names) -> list[str]:
    head = ["workload", "width", "batch x seq", "GFLOP/call"]
    key = [[c.workload, c.width, f"{c.batch}x{c.seq}", _gflop(c.flops)] for c in cells]

    def cells_of(fmt):
        return [k + [("error" if n in c.errors else fmt(c, n)) for n in names]
                for k, c in zip(key, cells)]

    ms = cells_of(lambda c, n: f"{c.ms[n]:,.2f}" if n in c.ms else "n/a")
    vs_cpu = cells_of(lambda c, n: f"{c.ratio(n, 'CPU eager'):.2f}x" if n in c.ms else "n/a")
    extra = ["DeferAndFuse / Strict"] if {"tpu DeferAndFuse", "tpu Strict"} <= set(names) else []
    if extra:
        for row, c in zip(vs_cpu, cells):
            r = c.ratio("tpu DeferAndFuse", "tpu Strict")
            row.append("n/a" if math.isnan(r) else f"{r:.2f}x")
    vs_jit = cells_of(lambda c, n: f"{c.ratio(n, 'jax.jit'):.2f}x" if n in c.ms else "n/a")
    short = [SHORT[n] for n in names]
    out = ["Median ms per call:", "", common.markdown_table(head + short, ms), "",
           "Ratio to CPU eager (CPU eager's time / this one's; above 1 is faster):", "",
           common.markdown_table(head + short + extra, vs_cpu),
           "", "Ratio to the hand-written jax.jit (the XLA limit; 1 is at the limit):", "",
           common.markdown_table(head + short, vs_jit), ""]
    errors = [f"- {c.workload} {_cell_name(c)}, {n}: {e}" for c in cells for n, e in c.errors.items()]
    if errors:
        out += ["Errors:", ""] + [e.replace("|", "\\|") for e in errors] + [""]
    dis = [f"{c.workload} {_cell_name(c)}: {', '.join(c.disagree)}" for c in cells if c.disagree]
    out.append("Greedy tokens differing from CPU eager's: " + ("; ".join(dis) if dis else
               "none (every contestant generated CPU eager's tokens in every cell)") + ".")
    return out


def render(cells, names, args, sample_s, wall_s, load_before, load_after) -> str:
    lines = [
        (f"Llama, 2 layers, vocab 256, intermediate 2 x width, heads max(4, width / 64), fp32. "
        f"*train*: forward + backward + AdamW; *generate*: greedy `generate` of "
        f"{args.new_tokens} new tokens after a prompt of batch x seq tokens (the table's "
        "FLOPs count the prefill and the decode steps). Each cell: a first (compiling) call "
        "and warm-up per contestant, then interleaved rounds; a sample is a batch of calls "
        f"of ≥ {sample_s * 1e3:.0f} ms, the rounds fill {args.cell_seconds:g} s per cell "
        f"(at least {args.min_rounds}). FLOPs: the matmuls of the model (projections, "
        "attention, LM head; backward = 2x forward), not AdamW. *compiled*: training "
        "compiles the model and `opt.step` (as `bench compile`); generation uses HF's static "
        "cache and `compile_config(backend=...)`, which compiles the decode steps and runs "
        "the prefill eagerly (Strict). *jax.jit*: the training step, or the whole greedy "
        f"generation (KV cache, `fori_loop`), as one program. Sweep wall time {wall_s / 60:.1f} "
        f"min; load average (1, 5, 15 min) before: {load_before}, after: {load_after}."),
        "",
    ]
    lines += tables(cells, names)
    lines += ["", "![ratio to CPU eager vs FLOPs per call](bench_scaling.png)", "",
              "### Where each mode crosses CPU eager, and how close it stays to jax.jit", ""]
    lines += summary(cells, names)
    return "\n".join(lines)


def plot(cells, names, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(c.workload for c in cells))
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.2 * len(workloads), 8.4), squeeze=False)
    for j, w in enumerate(workloads):
        rows = sorted((c for c in cells if c.workload == w), key=lambda c: c.flops)
        for i, ref in enumerate(("CPU eager", "jax.jit")):
            ax = axes[i][j]
            for k, n in enumerate(SHORT):  # one colour per contestant in every panel
                pts = [(c.flops, c.ratio(n, ref)) for c in rows if c.ratio(n, ref) > 0]
                if pts and n != ref and n in names:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=1,
                            color=f"C{k}", label=SHORT[n])
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("model FLOPs per call")
            ax.set_ylabel(f"speed vs {ref} (x)")
            ax.set_title(f"Llama {w}: ratio to {ref}")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
