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


# what was measured about the numbers (written with the run of 2026-12-01; rerun, re-read)
NOTES = """### Reading these numbers

- **The machine was heavily loaded** (load average 5-11 on 2 cores throughout: other
  benchmarks and test runs), so absolute times are several times their quiet values and
  CPU eager is hit hardest. With torch's default two-thread team, one descheduled thread
  stalls the other at every kernel's barrier: CPU eager took 447 ms for the width-64,
  4x32 training step here, where `bench compile --threads 1` measured 25.5 ms for the
  same model and batch on the same machine an hour earlier; that cell alone, CPU eager
  against jax.jit, run twice back to back at load ~7.5 (`bench scaling --widths 64
  --tokens 4x32 --workloads train --skip tpu --skip inductor --min-rounds 5`): CPU
  eager 1,089 ms with two threads, 22.5 ms with `--threads 1` (jax.jit 8.3 and 10.1
  ms). So the *ratio to CPU eager*
  columns above overstate every tpu mode at the small cells; the *ratio to jax.jit*
  columns of the tpu modes (both sides on XLA:CPU's thread pool) are the steadier ones. On a shared
  machine, run with `--threads 1`. A rerun with `--threads 1` was started and stopped
  at 40% when the machine's load (~11) made it too slow to finish.
- **DeferAndFuse against Strict falls towards 1.0x as the cell grows**, below the 1.5x
  target at every training cell up to width 512 except the smallest (2.56x at width 64,
  4x32; 1.44x and 1.27x at 128 tokens, widths 256 and 512; 1.00-1.10x at 4096 tokens).
  This is where the time goes, not a DeferAndFuse regression: both modes run the same
  XLA:CPU kernels, and DeferAndFuse saves only the per-op dispatch, a fixed cost per
  step, while the kernels grow with the FLOPs. At 4096 tokens the step is its matmuls:
  the 45 linear-layer matmuls of the width-512, 16x256 training step, timed one by one
  (`bench scaling --threads 1 --profile-gemms 512:16x256`, load ~10), sum to 7.06 s on
  XLA:CPU's dot against 6.30 s in `torch.mm` (1.12x; per shape 0.90-1.30x), at least
  as long as the whole step measured in the sweep (Strict 4.81 s, DeferAndFuse 4.48 s,
  jax.jit 5.25 s; the profile ran at a heavier moment). There DeferAndFuse sits at the
  XLA limit (1.17x jax.jit, within the noise of 1.0), so no eager mode can gain more
  over Strict than Strict's distance from jax.jit, which is 1.01-1.09x at 4096 tokens.
  At 128 tokens (`--profile-gemms 256:4x32`) the step's matmuls are small: 9.5 ms in
  `torch.mm` against 12.1 ms on XLA:CPU (1.27x; 1.81x for the 128x256 @ 256x256 ones),
  so on kernels alone XLA:CPU starts behind torch's CPU kernels, and what DeferAndFuse
  wins back is dispatch (width 256, 4x32: 1.58x jax.jit, i.e. jax.jit itself was
  disturbed there; ratios between neighbouring cells move by 2x under this load).
- **Where the modes cross CPU eager.** In this run every tpu mode stays above CPU eager
  in generation, and Strict and compiled in training; DeferAndFuse dips to 0.93x at width
  1024, 4x32 only. Given the stall above, the crossover figures in the summary are not
  the quiet machine's: the matmul profile says that in the compute-bound cells (≥ 40
  GFLOP per step) XLA:CPU's kernels are 1.0-1.3x slower than torch's at one thread each,
  so on a quiet machine every XLA path, jax.jit included, is expected at or somewhat
  below CPU eager there.
- **Cores.** In the matmul profile XLA:CPU kept 1.0-1.5 cores busy on the small matmuls
  against torch's 1.0 (one thread); under the load of the large-cell profile both got
  0.2-0.3 of a core.
- **Generation** runs 8 new tokens; the hand-written jax.jit generation is one program
  (prefill and a `fori_loop` of decode steps), so at 128 prompt tokens it is 30-50x CPU
  eager and 3-25x every torch path, which pay HF's per-token Python and, in eager, the
  per-op dispatch of each decode step. Every contestant generated CPU eager's tokens.
- **Time.** The default grid took 49 min at this load, over the ~20 min aimed at: each
  cell's compiles (inductor's cold compile of the training step ~1.5-2 min, the tpu
  modes' ~15-25 s each) dominate; the measuring itself is ~3 s per cell plus at least 3
  rounds of the large steps. A second run finds the tpu programs in the persistent cache
  and inductor's FX graph cache warm.
"""
