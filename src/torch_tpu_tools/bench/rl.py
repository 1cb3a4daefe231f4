"""`python -m torch_tpu bench rl`: the GRPO loop on tpu and on CPU eager.

The loop is `torch_tpu_tools.grpo.GRPO`, the one that examples/grpo.py runs (one
implementation for the example, its tests and this bench): per iteration, the rollout
(N prompts x G sampled completions, a fixed number of new tokens, temperature and top-k on
the device's generator), scoring (the toy reward and the group-normalized advantages),
the frozen reference policy's forward, and the update (clipped policy-gradient loss with
a KL term, backward, AdamW).

Variants, each with its own copy of the same initial weights, in one process: tpu Strict,
tpu DeferAndFuse, tpu Strict with torch.compile(backend="tpu") on the forward, and
PyTorch's CPU eager. After warm-up iterations (the compiles: two whole, one split; the
kinds are below), the variants take turns round by round, the order rotating every round, so other
load on the machine falls on all of them alike. Two kinds of rounds alternate:
  - whole: one iteration, waited for once at its end (`.item()` of the reward and loss):
    the iteration time, and the ratio to CPU eager;
  - split: one iteration with a device sync at every phase boundary: the time of each
    phase, and rollout tokens/s. The syncs cost DeferAndFuse most (each ends a fused graph).
Also counted: programs compiled during the measured rounds (should be none).
"""
from __future__ import annotations

import argparse
import copy
import os
import time

import torch

from .. import grpo
from ..workloads import decoder
from . import common

PHASES = ("rollout", "scoring", "reference", "update")
VARIANTS = {  # name -> (device, eager mode, compile the forward)
    "Strict": ("tpu", "strict", False),
    "DeferAndFuse": ("tpu", "defer_and_fuse", False),
    "compiled": ("tpu", "strict", True),
    "CPU eager": ("cpu", None, False),
}


class Contestant:
    """One variant's GRPO state and its samples."""

    def __init__(self, name, cfg, base, prompts):
        self.name = name
        self.device, self.mode, compile_ = VARIANTS[name]
        self.prompts = prompts
        self.i = 0
        with common.eager(self.mode):
            self.grpo = grpo.GRPO(cfg, self.device, compile=compile_, model=copy.deepcopy(base))
        self.whole, self.split = [], {p: [] for p in PHASES}
        self.rewards, self.first_s = [], 0.0

    def iteration(self, phases=None) -> float:
        prompts = self.prompts[self.i % len(self.prompts)]
        self.i += 1
        with common.eager(self.mode):
            time.sleep(1e-3)  # let the previous contestant's worker threads settle (common.timed)
            t0 = time.perf_counter()
            reward, _ = self.grpo.step(prompts, phases)
            dt = time.perf_counter() - t0
        self.rewards.append(reward)
        return dt

    def whole_round(self) -> float:
        dt = self.iteration()
        self.whole.append(dt)
        return dt

    def split_round(self) -> float:
        phases = {}
        dt = self.iteration(phases)
        for p in PHASES:
            self.split[p].append(phases[p])
        return dt


def measure(cfg, names, warmup, rounds, bar):
    base = decoder.build_model(cfg.model_spec())
    prompts = grpo.prompt_batches(cfg, 16)
    out = {}
    for name in names:
        bar.set_description(f"bench rl: {name} warm-up")
        c = out[name] = Contestant(name, cfg, base, prompts)
        t0 = time.perf_counter()
        # whole iterations (the second is the first with AdamW's state), then a split one:
        # its syncs cut DeferAndFuse's graphs elsewhere, so those graphs compile here too
        for phases in [None] * warmup + [{}]:
            c.iteration(phases)
            bar.update(1)
        c.first_s = time.perf_counter() - t0
    bar.set_description("bench rl: interleaved rounds")
    before = grpo.compiled_programs()
    for r in range(rounds):
        kind = "whole_round" if r % 2 == 0 else "split_round"
        common.interleaved({n: getattr(c, kind) for n, c in out.items()}, 1)
        # rotate the order of the next round's contestants (interleaved rotates by round)
        out = dict(list(out.items())[1:] + list(out.items())[:1])
        bar.update(1)
    compiled = grpo.compiled_programs() - before
    return {n: out[n] for n in names}, compiled


# ---------------------------------------------------------------- report


def render(res, compiled, cfg, args, seconds, load_start) -> str:
    def ms(s):
        return f"{s * 1e3:,.1f}"

    cpu = res.get("CPU eager")
    tokens = cfg.prompts * cfg.group * cfg.new_tokens
    header = ["variant", "iteration (ms)", "vs CPU eager (≥ 1.0x)"] + [f"{p} (ms)" for p in PHASES] + [
        "phases sum (ms)", "rollout tokens/s", "warm-up (s)", "reward: first 3 -> last 3"]
    rows = []
    for name, c in res.items():
        it = common.median(c.whole)
        split = {p: common.median(v) for p, v in c.split.items()}
        ratio = common.median(cpu.whole) / it if cpu else float("nan")
        mark = f"**{ratio:.2f}x**" if ratio >= 1.0 else f"{ratio:.2f}x"
        r = c.rewards
        rows.append([name, ms(it), "1.00x" if c is cpu else mark] + [ms(split[p]) for p in PHASES]
                    + [ms(sum(split.values())), f"{tokens / split['rollout']:,.0f}",
                       f"{c.first_s:.1f}", f"{sum(r[:3]) / 3:.3f} -> {sum(r[-3:]) / 3:.3f}"])
    lines = [
        (f"The loop of `torch_tpu_tools.grpo` (`GRPO`, run by `examples/grpo.py`), one "
        f"implementation for the example, its tests and this bench. Model: Llama, hidden "
        f"{cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, vocab {cfg.vocab}, fp32, "
        f"random weights. Per iteration: "
        f"{cfg.prompts} prompts x {cfg.group} completions of {cfg.new_tokens} tokens after a "
        f"{cfg.prompt_len}-token prompt ({tokens} sampled tokens, one full-length forward per "
        f"token over a preallocated buffer), top-k {cfg.top_k}; reference forward; "
        f"{cfg.updates} AdamW update(s). Variants: tpu Strict, tpu DeferAndFuse, tpu Strict "
        "with `torch.compile(backend=\"tpu\")` on the forward, PyTorch CPU eager; each its "
        f"own copy of the same weights; {torch.get_num_threads()} torch CPU thread(s) "
        f"(`--threads`). Warm-up: {args.warmup} whole iterations and one split each, then "
        f"{args.rounds} interleaved rounds (order rotating), alternately *whole* (one sync at "
        "the iteration's end: the iteration column) and *split* (a sync at every phase "
        "boundary: the phase columns). Medians. "
        f"Programs compiled during the measured rounds, all tpu variants: {compiled}. "
        f"Whole run: {seconds:.0f} s. Load average (`uptime`) at the start: {load_start}."),
        "", common.markdown_table(header, rows), "", "![GRPO iteration by phase](bench_rl.png)", ""]
    lines += [common.notes(args.out, "rl"), "", "### Against the issue's target", ""]
    for name, c in res.items():
        if c is cpu or cpu is None:
            continue
        ratio = common.median(cpu.whole) / common.median(c.whole)
        verdict = "meets" if ratio >= 1.0 else "misses"
        lines.append(f"- {name}: warm iteration {ms(common.median(c.whole))} ms vs CPU eager "
                     f"{ms(common.median(cpu.whole))} ms: {ratio:.2f}x ({verdict} ≥ 1.0x)")
    return "\n".join(lines)


def chart(res, path) -> None:
    groups = list(PHASES) + ["iteration"]
    series = {n: [common.median(c.split[p]) * 1e3 for p in PHASES] + [common.median(c.whole) * 1e3]
              for n, c in res.items()}
    common.bar_chart(path, "GRPO iteration by phase (ms, lower is better)", groups, series,
                     "ms (median)", log=True)


# ---------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=16,
                   help="interleaved rounds, alternately whole and split (default 16)")
    p.add_argument("--warmup", type=int, default=2,
                   help="whole warm-up iterations per variant, then one split (default 2)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma list of: {', '.join(VARIANTS)}")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine CPU eager's "
                        "thread team spin-waits against other load; measured here at load 6, "
                        "one GRPO iteration took 5.9 s with 2 threads, 0.27 s with 1)")
    common.add_output_arguments(p)


def main(args) -> int:
    import torch_tpu  # noqa: F401  (registers the device)

    t0 = time.perf_counter()
    load_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    torch.set_num_threads(args.threads)
    cfg = grpo.Config()
    with common.progress(len(names) * (args.warmup + 1) + args.rounds, "bench rl") as bar:
        res, compiled = measure(cfg, names, args.warmup, args.rounds, bar)
    text = render(res, compiled, cfg, args, time.perf_counter() - t0, load_start)
    print(text)
    if not args.no_write:
        common.publish(args.out, "rl", "RL: the GRPO loop on tpu vs CPU eager", text,
                       {"bench_rl.png": lambda path: chart(res, path)})
    return 0
