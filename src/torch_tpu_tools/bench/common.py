"""Shared benchmark helpers: synchronization, interleaved timing, child processes, the
output folder, the report section in OUT/PERFORMANCE.md, and bar charts.

The output folder is an argument (`--out DIR`, default ./docs: the checkout's docs/ when
run from its root), never a path derived from where the code lives: an installed wheel
has no docs/. Each bench owns one section of PERFORMANCE.md, between
`<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->`; rerunning the bench replaces its
section and leaves the others alone.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time

import torch

_HEADER = """# Performance

Measured numbers, written by the benchmarks themselves (`python -m torch_tpu bench ...`).
Each section names the exact command that produced it and when. All runs here are on
XLA:CPU (the machines are CPU-only), so "tpu" means the tpu device running on XLA:CPU:
the numbers show torch_tpu's own overhead, not TPU speed.
"""


def add_output_arguments(p, writes: str = "PERFORMANCE.md and the chart",
                         no_write: bool = True) -> None:
    """`--out DIR` (and `--no-write`): the same on every bench and on `validate`."""
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"), metavar="DIR",
                   help=f"the docs folder: {writes} go there, and a bench's notes are read "
                        "from DIR/bench_notes/NAME.md (default: ./docs)")
    if no_write:
        p.add_argument("--no-write", action="store_true", help="print only; write nothing")


def publish(out: pathlib.Path, name: str, title: str, body: str, charts: dict | None = None,
            md: str = "PERFORMANCE.md") -> None:
    """Draw each chart (file name -> draw(path)) into `out`, replace this bench's section of
    OUT/md, and say what was written."""
    for file, draw in (charts or {}).items():
        draw(out / file)
    write_section(name, title, body, out / md)
    print(f"\nwrote {out / md}" + "".join(f", {out / f}" for f in charts or {}))


def eager(mode: str | None):
    """The tpu eager mode `mode` as a context; none for CPU eager (`None` or "cpu")."""
    if mode in (None, "cpu"):
        return contextlib.nullcontext()
    import torch_tpu

    return torch_tpu.eager_mode(mode)


def programs() -> int:
    """Programs compiled so far in this process, every kind: XLA compiles plus persistent
    (disk) cache hits."""
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


RESULT = "RESULT "  # a child process's answer: the line "RESULT {json}" it prints last


def run_child(cmd: list[str], env: dict, timeout: float) -> dict:
    """Run a bench's child process -> the json of its last RESULT line, or {"error": ...}
    saying why there is none (it ran past `timeout`, or failed: its last stderr line)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"the child process ran past {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"the child process failed ({proc.returncode}): {tail}"[:200]}
    return json.loads(lines[-1][len(RESULT):])


def one_line(e: BaseException, limit: int = 160) -> str:
    """An error as one table cell: its type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:limit]


def sync(device: str) -> None:
    """Wait for all queued work on `device` (a no-op for CPU eager)."""
    if device == "tpu":
        torch.tpu.synchronize()


def median(xs) -> float:
    return statistics.median(xs)


def interleaved(fns: dict, rounds: int, progress=None) -> dict:
    """Run each `fns[name]()` once per round, rotating the order every round so drift
    (other load on the machine, frequency changes) hits every contestant alike. Each call
    returns its own measured seconds. Returns name -> list of samples."""
    names = list(fns)
    samples = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            samples[n].append(fns[n]())
        if progress is not None:
            progress.update(1)
    return samples


def timed(fn, reps: int, sync_fn, settle_s: float = 1e-3) -> float:
    """Seconds per call of `fn`, over a batch of `reps` calls and one sync at the end.

    The short sleep first lets the previous contestant's worker threads (XLA's pool, torch's
    OpenMP team) stop spinning: on a 2-core machine they otherwise steal the next
    contestant's cores."""
    sync_fn()
    time.sleep(settle_s)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync_fn()
    return (time.perf_counter() - t0) / reps


def command_line() -> str:
    """The command that is running, as a user would type it."""
    argv = sys.argv[1:]
    if sys.argv and sys.argv[0].endswith("__main__.py"):
        return "python -m torch_tpu " + " ".join(shlex.quote(a) for a in argv)
    return " ".join(shlex.quote(a) for a in sys.argv)


def environment_line() -> str:
    import jax

    from torch_tpu import _runtime

    d = _runtime.device()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"torch {torch.__version__}, jax {jax.__version__}, PJRT {d.platform} "
            f"({d.device_kind}), {platform.machine()}, {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} torch threads, load average {load} at the end "
            "(a load above the core count slows CPU eager's thread team most)")


def notes(out: pathlib.Path, name: str) -> str:
    """A bench's hand-written reading of its figures, OUT/bench_notes/NAME.md (prose kept
    with the docs and edited there after a run), under its heading; "" if there is none."""
    path = out / "bench_notes" / f"{name}.md"
    return f"### Reading these numbers\n\n{path.read_text().strip()}" if path.exists() else ""


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def write_section(name: str, title: str, body: str, path: pathlib.Path) -> None:
    """Replace (or append) this bench's section of the markdown file `path`."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"{begin}\n## {title}\n\n"
               f"Produced by `{command_line()}` on {stamp}.  \n{environment_line()}.\n\n"
               f"{body.strip()}\n{end}")
    text = path.read_text() if path.exists() else _HEADER
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def bar_chart(path: pathlib.Path, title: str, groups: list[str], series: dict, ylabel: str,
              log: bool = True) -> None:
    """A grouped bar chart: one group per label, one bar per series (name -> values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series)
    width = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) + 2), 4.2))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v == v else 0 for v in values], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="round", leave=False, dynamic_ncols=True,
                file=sys.stderr)
