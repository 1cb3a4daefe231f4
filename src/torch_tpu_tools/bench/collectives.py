"""`python -m torch_tpu bench collectives`: tpu_dist against torch's gloo, same processes.

Two processes (by default) on 127.0.0.1 join one job with a tpu_dist default group and a
gloo group beside it. For each size, every contestant runs once per round, rounds rotate
the order, and every sample starts on a gloo barrier so both ranks time the same thing:
  - gloo: `dist.all_reduce` / `dist.all_gather_into_tensor` / `dist.reduce_scatter_tensor`
    of CPU tensors on the gloo group;
  - tpu_dist: the same calls on tpu tensors, ending in a wait for the result;
  - plain JAX (all_reduce only): a bare `jit(shard_map(psum))` on the same processes, the
    baseline DESIGN.md measured (no donation, fresh output each call).
Bus bandwidth follows nccl-tests: all_reduce moves 2(n-1)/n of the buffer per rank,
all_gather and reduce_scatter (n-1)/n of the large buffer; a size is the all_reduce
buffer, the all_gather output or the reduce_scatter input (FSDP's gradient reduction).
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time

from . import common

_TARGETS = {  # (op, size predicate) -> (minimum tpu/gloo bandwidth ratio, description)
    "all_gather": (1.0, lambda b: b >= 4 << 20, "≥ 1.0× gloo from 4 MB"),
    "all_reduce": (0.8, lambda b: (1 << 20) <= b <= 16 << 20, "≥ 0.8× gloo at 1-16 MB"),
}
OPS = ("all_reduce", "all_gather", "reduce_scatter")  # reduce_scatter: measured, no target


def add_arguments(p) -> None:
    p.add_argument("--sizes", default="4K,1M,4M,16M,64M",
                   help="comma-separated sizes (K/M suffixes), default %(default)s")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds per size")
    p.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    common.add_output_arguments(p, "PERFORMANCE.md")


def _parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _fmt_size(b: int) -> str:
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- worker
def _calls_per_sample(nbytes: int) -> int:
    return max(1, min(50, (8 << 20) // max(nbytes, 1)))


def _worker(rank: int, world: int, sizes, rounds: int, out_path: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import torch_tpu  # noqa: F401
    import torch_tpu.distributed  # noqa: F401
    from torch_tpu import _storage

    dist.init_process_group("tpu_dist")
    gloo = dist.new_group(backend="gloo")
    plain = _plain_psum(dist.group.WORLD)

    def block(t):
        _storage.record(t.untyped_storage(), t.dtype)[0].block_until_ready()

    results = []
    for nbytes in sizes:
        n = nbytes // 4
        k = _calls_per_sample(nbytes)
        cpu, tpu = torch.ones(n), torch.ones(n, device="tpu")
        cpu_in, tpu_in = torch.ones(n // world), torch.ones(n // world, device="tpu")
        cpu_out, tpu_out = torch.empty(n), torch.empty(n, device="tpu")
        raw = plain.array(n)

        def gloo_ar():
            for _ in range(k):
                dist.all_reduce(cpu, group=gloo)

        def tpu_ar():
            for _ in range(k):
                dist.all_reduce(tpu)
            block(tpu)

        def jax_ar():
            out = None
            for _ in range(k):
                out = plain(raw)
            out.block_until_ready()

        def gloo_ag():
            for _ in range(k):
                dist.all_gather_into_tensor(cpu_out, cpu_in, group=gloo)

        def tpu_ag():
            for _ in range(k):
                dist.all_gather_into_tensor(tpu_out, tpu_in)
            block(tpu_out)

        def gloo_rs():  # the full buffer in, this rank's 1/world of the sum out
            for _ in range(k):
                dist.reduce_scatter_tensor(cpu_in, cpu, group=gloo)

        def tpu_rs():
            for _ in range(k):
                dist.reduce_scatter_tensor(tpu_in, tpu)
            block(tpu_in)

        fns = {("all_reduce", "gloo"): gloo_ar, ("all_reduce", "tpu_dist"): tpu_ar,
               ("all_reduce", "plain JAX"): jax_ar, ("all_gather", "gloo"): gloo_ag,
               ("all_gather", "tpu_dist"): tpu_ag, ("reduce_scatter", "gloo"): gloo_rs,
               ("reduce_scatter", "tpu_dist"): tpu_rs}
        for fn in fns.values():  # warm-up: compiles, first-touch of buffers
            fn()
        samples = {key: [] for key in fns}
        names = list(fns)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for key in order:
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                fns[key]()
                samples[key].append((time.perf_counter() - t0) / k)
        for (op, who), ts in samples.items():
            results.append({"op": op, "who": who, "bytes": nbytes,
                            "seconds": statistics.median(ts)})
        del cpu, tpu, cpu_in, tpu_in, cpu_out, tpu_out, raw
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"world": world, "results": results}, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    del np


class _plain_psum:
    """The baseline: a bare jitted psum over the same processes' devices."""

    def __init__(self, group):
        import jax
        from jax import lax
        from jax.sharding import PartitionSpec as P

        self.gm = group.mesh()
        self.fn = jax.jit(jax.shard_map(lambda x: lax.psum(x, "g"), mesh=self.gm.mesh,
                                        in_specs=P("g"), out_specs=P("g")))

    def array(self, n):
        import jax
        import numpy as np

        from torch_tpu import _runtime

        return self.gm.glob(jax.device_put(np.ones(n, np.float32), _runtime.device()))

    def __call__(self, x):
        return self.fn(x)


# ---------------------------------------------------------------- report
def _bus(op: str, world: int) -> float:
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def table(data, targets=_TARGETS) -> tuple[str, list[str]]:
    """The markdown table of `measure`'s data and the verdicts on `targets` (op -> (minimum
    tpu_dist / gloo ratio, size predicate, description); default: issue 5's)."""
    world = data["world"]
    by = {(r["op"], r["who"], r["bytes"]): r["seconds"] for r in data["results"]}
    sizes = sorted({r["bytes"] for r in data["results"]})
    rows, verdicts = [], []
    for op in OPS:
        ratio_min, applies, target = targets.get(op, (0.0, lambda b: False, ""))
        for b in sizes:
            g, t = by[(op, "gloo", b)], by[(op, "tpu_dist", b)]
            j = by.get((op, "plain JAX", b))
            bw = lambda s: b / s * _bus(op, world) / 1e9  # noqa: E731
            ratio = g / t
            met = "—"
            if applies(b):
                ok = ratio >= ratio_min
                met = "yes" if ok else "no"
                verdicts.append(f"{op} {_fmt_size(b)}: {ratio:.2f}× ({target}): "
                                f"{'met' if ok else 'NOT met'}")
            rows.append([f"`{op}`", _fmt_size(b), f"{g * 1e3:.3f}", f"{t * 1e3:.3f}",
                         f"{j * 1e3:.3f}" if j else "—", f"{bw(g):.2f}", f"{bw(t):.2f}",
                         f"{ratio:.2f}×", f"{g / j:.2f}×" if j else "—", met])
    header = ["op", "size", "gloo ms", "tpu_dist ms", "plain JAX ms", "gloo bus GB/s",
              "tpu_dist bus GB/s", "tpu_dist / gloo", "plain JAX / gloo", "target met"]
    return common.markdown_table(header, rows), verdicts


def _launch(nproc: int, sizes, rounds: int, out: str) -> None:
    """Start the ranks as torchrun does (fresh interpreters, env:// rendezvous)."""
    import subprocess

    port = _free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch_tpu_tools.bench.collectives", "--worker",
               json.dumps({"sizes": sizes, "rounds": rounds, "out": out})]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"collectives bench: ranks exited with {codes}")


def measure(nproc: int, sizes, rounds: int) -> dict:
    """Every op at every size, gloo and tpu_dist (and plain JAX) on `nproc` processes:
    {"world": n, "results": [{"op", "who", "bytes", "seconds"}, ...]}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        _launch(nproc, sizes, rounds, out)
        with open(out) as f:
            return json.load(f)


def _fixed_cost_verdict(data) -> str:
    """Issue 5's fixed-cost target: the smallest all_reduce within 2x gloo's time."""
    by = {(r["op"], r["who"], r["bytes"]): r["seconds"] for r in data["results"]}
    small = min(r["bytes"] for r in data["results"])
    g, t = by[("all_reduce", "gloo", small)], by[("all_reduce", "tpu_dist", small)]
    return (f"fixed cost, {_fmt_size(small)} all_reduce: {t * 1e6:.0f} µs vs gloo "
            f"{g * 1e6:.0f} µs = {t / g:.2f}× (target ≤ 2×): {'met' if t <= 2 * g else 'NOT met'}")


def plot_bandwidth(data, path) -> None:
    """Bus bandwidth against size, gloo and tpu_dist, one panel per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    world = data["world"]
    fig, axes = plt.subplots(1, len(OPS), figsize=(5 * len(OPS), 3.8), squeeze=False)
    for ax, op in zip(axes[0], OPS):
        for who in ("gloo", "tpu_dist"):
            pts = sorted((r["bytes"], r["bytes"] / r["seconds"] * _bus(op, world) / 1e9)
                         for r in data["results"] if r["op"] == op and r["who"] == who)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=who)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("bus GB/s")
        ax.set_title(f"{op}, {world} processes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args) -> int:
    sizes = [_parse_size(s) for s in args.sizes.split(",") if s.strip()]
    t0 = time.time()
    data = measure(args.nproc, sizes, args.rounds)
    markdown, verdicts = table(data)
    verdicts.append(_fixed_cost_verdict(data))
    body = (f"{args.nproc} processes on 127.0.0.1, float32, median seconds per call over "
            f"{args.rounds} interleaved rounds (each a batch of calls ending in a wait for the "
            "result), every sample started on a barrier. Bus bandwidth as in nccl-tests; "
            "ratios are bandwidth ratios (higher is better for tpu_dist). *plain JAX* is a bare "
            "`jit(shard_map(psum))` on the same processes: DESIGN.md's baseline.\n\n"
            + markdown + "\n\nTargets (issue 5):\n" + "\n".join(f"- {v}" for v in verdicts)
            + f"\n\nWall time of the run: {time.time() - t0:.0f} s.")
    print(body)
    if not args.no_write:
        common.publish(args.out, "collectives", "Collectives: tpu_dist vs gloo", body)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    cfg = json.loads(sys.argv[2])
    _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), cfg["sizes"],
            cfg["rounds"], cfg["out"])
