"""`python -m torch_tpu bench ops`: what one eager op costs.

Three contestants run the same op on the same values, interleaved round by round in one
process so that machine noise falls on all of them alike:
  - tpu:   Strict eager on the tpu device (dispatcher -> lowering -> cached jax.jit);
  - jit:   a bare, already-compiled `jax.jit` call on the same PJRT device, the floor
           that Strict's per-op overhead is measured against;
  - cpu:   PyTorch's own CPU eager kernel.
Each sample is a batch of calls that ends waiting for its last result (tpu and jit alike:
torch.tpu.synchronize would add its sweep over every live buffer, ~70 us with 200 of them,
to tpu's batch alone); the table reports the median per call. Then a small Llama training
step (forward, backward, AdamW), tpu Strict vs CPU eager, also interleaved.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Callable

import torch

from . import common

OVERHEAD_TARGET_US = 5.0
SIZES = ("small", "medium")


@dataclasses.dataclass(frozen=True)
class OpCase:
    name: str
    torch_fn: Callable  # (*tensors) -> tensor, the same code for tpu and CPU
    jax_fn: Callable    # (*arrays) -> array
    shapes: dict        # size -> tuple of input shapes


def _jnp():
    import jax.numpy as jnp

    return jnp


def _softmax(x):
    import jax

    return jax.nn.softmax(x, axis=-1)


def _add_(a, b):
    return a.add_(b)


_SMALL, _MEDIUM = (4,), (4, 64, 128)
CASES = [
    OpCase("add", lambda a, b: a + b, lambda a, b: a + b,
           {"small": (_SMALL, _SMALL), "medium": (_MEDIUM, _MEDIUM)}),
    OpCase("mul", lambda a, b: a * b, lambda a, b: a * b,
           {"small": (_SMALL, _SMALL), "medium": (_MEDIUM, _MEDIUM)}),
    OpCase("mm", torch.mm, lambda a, b: _jnp().matmul(a, b),
           {"small": ((2, 2), (2, 2)), "medium": ((256, 128), (128, 128))}),
    OpCase("sum", torch.sum, lambda a: _jnp().sum(a),
           {"small": (_SMALL,), "medium": (_MEDIUM,)}),
    OpCase("relu", torch.relu, lambda a: _jnp().maximum(a, 0),
           {"small": (_SMALL,), "medium": (_MEDIUM,)}),
    OpCase("softmax", lambda a: torch.softmax(a, -1), _softmax,
           {"small": (_SMALL,), "medium": (_MEDIUM,)}),
    # In place on tpu and CPU; jax arrays are immutable, so its floor is the out-of-place add.
    OpCase("add_", _add_, lambda a, b: a + b,
           {"small": (_SMALL, _SMALL), "medium": (_MEDIUM, _MEDIUM)}),
]


@dataclasses.dataclass
class OpResult:
    name: str
    size: str
    shapes: tuple
    us: dict            # contestant -> median µs per call (nan when it could not run)
    error: str = ""

    @property
    def overhead_us(self) -> float:
        return self.us["tpu"] - self.us["jit"]


def _contestants(case: OpCase, size: str, reps: int) -> dict:
    """contestant -> a zero-argument function that times one batch of `reps` calls."""
    import jax

    from torch_tpu import _runtime, _storage
    from torch_tpu.op import current

    g = torch.Generator().manual_seed(0)
    cpu_in = [torch.randn(s, generator=g) for s in case.shapes[size]]
    tpu_in = [t.to("tpu") for t in cpu_in]
    jax_in = [jax.device_put(t.numpy(), _runtime.device()) for t in cpu_in]
    jitted = jax.jit(case.jax_fn)
    last = [None, None]  # jit's and tpu's latest results

    def jit_call():
        last[0] = jitted(*jax_in)

    def jit_sync():
        if last[0] is not None:
            last[0].block_until_ready()

    def tpu_call():
        last[1] = case.torch_fn(*tpu_in)

    def sync_tpu():
        if last[1] is not None:
            current.flush_pending("bench")  # (a first call may still be pending: eager/window.py)
            getattr(last[1].untyped_storage(), _storage.ATTR)[0].block_until_ready()

    def nothing():
        pass

    fns = {
        "tpu": (tpu_call, sync_tpu),
        "jit": (jit_call, jit_sync),
        "cpu": (lambda: case.torch_fn(*cpu_in), nothing),
    }
    for fn, sync in fns.values():  # compile and warm up outside the measurement
        for _ in range(3):
            fn()
        sync()
    return {name: (lambda fn=fn, sync=sync: common.timed(fn, reps, sync))
            for name, (fn, sync) in fns.items()}


def bench_ops(rounds: int, reps: int, progress) -> list[OpResult]:
    results = []
    for case in CASES:
        for size in SIZES:
            shapes = case.shapes[size]
            try:
                fns = _contestants(case, size, reps)
            except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
                nan = float("nan")
                results.append(OpResult(case.name, size, shapes, {"tpu": nan, "jit": nan, "cpu": nan},
                                        error=common.one_line(e)))
                progress.update(rounds)
                continue
            samples = common.interleaved(fns, rounds, progress)
            us = {k: common.median(v) * 1e6 for k, v in samples.items()}
            results.append(OpResult(case.name, size, shapes, us))
    return results


@dataclasses.dataclass
class StepResult:
    ms: dict            # device -> median ms per training step
    first_ms: dict      # device -> ms of the first step (tpu: compiles every op)
    tokens: int
    error: str = ""


def bench_llama(rounds: int, progress) -> StepResult:
    from .. import workloads
    from ..workloads import decoder

    spec = decoder.DecoderSpec()
    batches = decoder.learnable_batches(spec, rounds + 3)
    base = decoder.build_model(spec)
    runs = {}
    first = {}
    try:
        for device in ("cpu", "tpu"):
            model = workloads.replicate(base, device)
            opt = decoder.make_optimizer(model, spec)
            it = iter(batches)
            ids = next(it).to(device)
            common.sync(device)
            t0 = time.perf_counter()
            decoder.train_step(model, opt, ids)
            common.sync(device)
            first[device] = (time.perf_counter() - t0) * 1e3
            for _ in range(2):
                decoder.train_step(model, opt, next(it).to(device))
            common.sync(device)
            runs[device] = (model, opt, it)
    except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
        progress.update(rounds)
        return StepResult({}, first, spec.tokens_per_step, error=common.one_line(e))

    def step_fn(device):
        model, opt, it = runs[device]

        def one():
            ids = next(it).to(device)
            common.sync(device)
            t0 = time.perf_counter()
            decoder.train_step(model, opt, ids)
            common.sync(device)
            return time.perf_counter() - t0

        return one

    samples = common.interleaved({d: step_fn(d) for d in runs}, rounds, progress)
    ms = {d: common.median(v) * 1e3 for d, v in samples.items()}
    return StepResult(ms, first, spec.tokens_per_step)


# ---------------------------------------------------------------- report
FLOOR_OPS, FLOOR_TARGET_US = ("add", "mul", "sum", "relu"), 3.0  # issue 17's Strict floor


def _floor_line(results) -> str:
    small = [r for r in results if r.size == "small" and r.name in FLOOR_OPS and not r.error]
    if not small:
        return "- Strict floor: not measured"
    worst = max(r.overhead_us for r in small)
    each = ", ".join(f"{r.name} {r.overhead_us:.1f}" for r in small)
    verdict = "met" if worst <= FLOOR_TARGET_US else "not met"
    return (f"- Strict floor, small size: {each} µs over the bare jax.jit call (target ≤ "
            f"{FLOOR_TARGET_US:g} µs for each: {verdict})")


def _fmt(x: float, digits: int = 1) -> str:
    return "n/a" if x != x else f"{x:,.{digits}f}"


def _shape_str(shapes) -> str:
    return " @ ".join("x".join(map(str, s)) for s in shapes) if len(shapes) == 2 and len(shapes[0]) == 2 \
        else "x".join(map(str, shapes[0]))


def render(ops: list[OpResult], step: StepResult, rounds: int, reps: int) -> str:
    header = ["op", "size", "shape", "tpu Strict µs", "bare jax.jit µs", "CPU eager µs",
              "Strict overhead µs", f"≤ {OVERHEAD_TARGET_US:g} µs", "tpu / jit", "tpu / CPU"]
    rows = []
    for r in ops:
        if r.error:
            rows.append([f"`{r.name}`", r.size, _shape_str(r.shapes), "n/a", "n/a", "n/a", "n/a",
                         "—", "—", r.error[:90].replace("|", "\\|")])
            continue
        t, j, c = r.us["tpu"], r.us["jit"], r.us["cpu"]
        rows.append([f"`{r.name}`", r.size, _shape_str(r.shapes), _fmt(t), _fmt(j), _fmt(c),
                     _fmt(r.overhead_us), "yes" if r.overhead_us <= OVERHEAD_TARGET_US else "no",
                     f"{t / j:.2f}x", f"{t / c:.2f}x"])
    lines = [
        f"Median per call over {rounds} interleaved rounds of {reps} calls, each round ending "
        "when its last result is ready. *Strict overhead* is tpu Strict minus the bare "
        "`jax.jit` call of the same computation on the same device; the target for hot ops "
        f"is ≤ {OVERHEAD_TARGET_US:g} µs.",
        "",
        common.markdown_table(header, rows),
        "",
        _floor_line(ops),
        "",
        "![per-op time](bench_ops.png)",
        "",
        "### Small Llama training step (forward + backward + AdamW, fp32)",
        "",
    ]
    if step.error:
        lines.append(f"Not measured: {step.error}")
    else:
        t, c = step.ms["tpu"], step.ms["cpu"]
        lines += [
            common.markdown_table(
                ["device", "median step ms", "tokens/s", "first step ms"],
                [["tpu Strict", _fmt(t), f"{step.tokens / t * 1e3:,.0f}", _fmt(step.first_ms['tpu'], 0)],
                 ["CPU eager", _fmt(c), f"{step.tokens / c * 1e3:,.0f}", _fmt(step.first_ms['cpu'], 0)]]),
            "",
            f"tpu / CPU step time: **{t / c:.2f}x** (hidden 64, 2 layers, 4 heads, vocab 256, "
            f"batch x seq = {step.tokens} tokens; the tpu first step includes compiling every op).",
        ]
    return "\n".join(lines)


def chart(ops: list[OpResult], path) -> None:
    ok = [r for r in ops if not r.error]
    if not ok:
        return
    groups = [f"{r.name} {r.size}" for r in ok]
    series = {
        "tpu Strict": [r.us["tpu"] for r in ok],
        "bare jax.jit": [r.us["jit"] for r in ok],
        "CPU eager": [r.us["cpu"] for r in ok],
    }
    common.bar_chart(path, "Per-op time (median, lower is better)", groups, series, "µs per call")


# ---------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=31, help="interleaved rounds per op (default 31)")
    # 200: each round starts after a 1 ms settle sleep (common.timed); at 50 calls, about as
    # long as the sleep, the first calls' cold caches added 1-3 us to every small op
    p.add_argument("--reps", type=int, default=200, help="calls per round (default 200)")
    p.add_argument("--step-rounds", type=int, default=10,
                   help="interleaved Llama training steps per device (default 10)")
    p.add_argument("--no-llama", action="store_true", help="skip the Llama training step")
    common.add_output_arguments(p)


def main(args) -> int:
    total = len(CASES) * len(SIZES) * args.rounds + (0 if args.no_llama else args.step_rounds)
    with common.progress(total, "bench ops") as bar:
        ops = bench_ops(args.rounds, args.reps, bar)
        if args.no_llama:
            step = StepResult({}, {}, 0, error="skipped (--no-llama)")
        else:
            step = bench_llama(args.step_rounds, bar)
    text = render(ops, step, args.rounds, args.reps)
    print(text)
    if not args.no_write:
        common.publish(args.out, "ops", "Per-op overhead: Strict eager vs bare jax.jit vs CPU eager",
                       text, {"bench_ops.png": lambda path: chart(ops, path)})
    return 0
