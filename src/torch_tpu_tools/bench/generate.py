"""`python -m torch_tpu bench generate`: how fast HF `generate()` decodes on tpu, every mode
side by side with CPU eager and a hand-written `jax.jit` generation, on a tiny Llama
(hidden 64, 2 layers, batch 1, prompt 8, greedy).

Decode speed is the marginal rate: each contestant generates SHORT and LONG new tokens from
the same prompt, and decode tokens/s = (LONG - SHORT) / (t(LONG) - t(SHORT)), medians of
interleaved calls. The prefill, generate()'s own setup and the final copy to the host are
in both calls and cancel; what is left is the cost of a token. The whole LONG call's rate
is reported beside it, and first calls (compiles) apart.

Contestants, in one process each with its own replica of the same weights, taking turns:
  - Strict, DeferAndFuse: generate() as a user calls it. On tpu it decodes at a bucketed
    capacity and captures its decode step (several tokens a launch: docs/CAPTURE.md);
  - the same, op by op (`TORCH_TPU_CAPTURED_GENERATE=0`), and Debug (op by op always);
  - compiled: HF's static cache with `compile_config(backend="tpu")`;
  - jax.jit: the whole greedy generation as one program (prefill, then a `fori_loop` of
    decode steps over a preallocated cache), one program per length;
  - CPU eager, in a process of its own (thread pools spin after work and skew what runs
    beside them).
Every contestant's LONG tokens are compared with CPU eager's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

from ..workloads import decoder
from . import common, scaling

SPEC = decoder.DecoderSpec(pad=0, gen_batch=1)
PROMPT = decoder.prompt_ids(SPEC)
SHORT, LONG = 16, 80
# name -> (eager mode, generate captures its decode step, compile backend); None: jax.jit
TPU = {"Strict": ("strict", True, None), "DeferAndFuse": ("defer_and_fuse", True, None),
       "compiled": ("strict", True, "tpu"), "Strict, op by op": ("strict", False, None),
       "DeferAndFuse, op by op": ("defer_and_fuse", False, None), "Debug": ("debug", False, None),
       "jax.jit": None}
CPU = "CPU eager"
# issue 34: decode tokens/s against CPU eager
TARGETS = {"Strict": 1.0, "DeferAndFuse": 1.5}


def add_arguments(p) -> None:
    common.add_output_arguments(p)
    p.add_argument("--rounds", type=int, default=8, help="measured rounds (each: SHORT and LONG)")
    p.add_argument("--child", choices=["cpu"], help=argparse.SUPPRESS)


@contextlib.contextmanager
def _captured(on: bool):
    key = "TORCH_TPU_CAPTURED_GENERATE"
    old = os.environ.get(key)
    if not on:
        os.environ[key] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


class _Torch:
    """`model.generate` greedy at either length (bench scaling's runner, one model)."""

    def __init__(self, base, device, mode=None, captured=True, backend=None):
        self.runner = scaling.TorchGenRunner(base, device, LONG, mode=mode, compile_backend=backend)
        self.captured = captured

    def __call__(self, new_tokens: int) -> torch.Tensor:
        self.runner.kw["max_new_tokens"] = new_tokens
        with _captured(self.captured):
            return self.runner.step(PROMPT)


class _Jax:
    def __init__(self, base):
        self.runners = {n: scaling.JaxGenRunner(base, n) for n in (SHORT, LONG)}

    def __call__(self, new_tokens: int) -> torch.Tensor:
        return self.runners[new_tokens].step(PROMPT)


def _counters() -> dict:
    from torch_tpu import metrics

    c = metrics.as_dict()["counters"]
    return {"programs": common.programs(), **{k: c.get(k, 0) for k in
                                              ("generate_captured", "generate_uncaptured")}}


def _measure(makers: dict, rounds: int, device: str, bar=None) -> dict:
    """name -> {first: {n: s}, t: {n: [s]}, tokens (LONG's, as a list), warm: counters moved
    over the measured calls}."""
    res, runners = {}, {}
    for name, make in makers.items():
        runners[name] = make()
        first = {}
        for n in (LONG, SHORT):  # LONG first: both lengths then share its capacity
            t0 = time.perf_counter()
            runners[name](n)
            first[str(n)] = time.perf_counter() - t0
        runners[name](SHORT)  # warm-up
        res[name] = {"first": first, "tokens": runners[name](LONG).tolist()}
    calls = dict.fromkeys(makers, 0)

    def timed(name):
        def run():
            out = {}
            calls[name] += 1
            for n in (SHORT, LONG) if calls[name] % 2 else (LONG, SHORT):
                t0 = time.perf_counter()
                runners[name](n)
                out[n] = time.perf_counter() - t0
            return out
        return run

    before = _counters() if device == "tpu" else {}
    samples = common.interleaved({n: timed(n) for n in makers}, rounds, bar)
    after = _counters() if device == "tpu" else {}
    for name in makers:
        res[name]["t"] = {str(n): [s[n] for s in samples[name]] for n in (SHORT, LONG)}
    if device == "tpu":  # (over every contestant's measured calls: they share a process)
        res["_warm"] = {k: after[k] - before[k] for k in after}
    return res


def _run(device: str, rounds: int, bar=None) -> dict:
    base = decoder.build_model(SPEC)
    if device == "cpu":
        return _measure({CPU: lambda: _Torch(base, "cpu")}, rounds, device, bar)
    makers = {name: (lambda: _Jax(base)) if how is None else
              (lambda how=how: _Torch(base, "tpu", how[0], how[1], how[2]))
              for name, how in TPU.items()}
    return _measure(makers, rounds, device, bar)


def main(args) -> int:
    if args.child == "cpu":
        print(common.RESULT + json.dumps(_run("cpu", args.rounds)))
        return 0
    cpu = common.run_child([sys.executable, "-m", "torch_tpu", "bench", "generate", "--child",
                            "cpu", "--rounds", str(args.rounds)], dict(os.environ), 1800)
    if "error" in cpu:
        print(cpu["error"])
        return 1
    import torch_tpu  # noqa: F401

    t0 = time.perf_counter()
    with common.progress(args.rounds, "bench generate") as bar:
        tpu = _run("tpu", args.rounds, bar)
    body, rates = _report(tpu, cpu, time.perf_counter() - t0, args.out)
    print(body)
    if not args.no_write:
        names = list(rates)
        chart = lambda path: common.bar_chart(  # noqa: E731
            path, "tiny Llama generate(): decode tokens/s, and the whole call's", names,
            {"decode (marginal)": [rates[n][0] for n in names],
             f"whole {LONG}-token call": [rates[n][1] for n in names]}, "tokens/s")
        common.publish(args.out, "generate", "Decode: HF generate() in every mode against CPU "
                       "eager and jax.jit (tiny Llama)", body, {"bench_generate.png": chart})
    return 0


def _rates(r: dict) -> tuple:
    """(decode tokens/s, the LONG call's tokens/s) from medians."""
    short, long_ = (common.median(r["t"][str(n)]) for n in (SHORT, LONG))
    per_token = (long_ - short) / (LONG - SHORT)
    return (SPEC.gen_batch / per_token if per_token > 0 else float("nan"),
            SPEC.gen_batch * LONG / long_)


def _report(tpu: dict, cpu: dict, seconds: float, out=None) -> tuple:
    from torch_tpu._integrations import generation_step

    warm = tpu.pop("_warm")
    both = {**tpu, **cpu}
    rates = {n: _rates(r) for n, r in both.items()}
    ref, jit = rates[CPU][0], rates["jax.jit"][0]
    rows = []
    for name, r in both.items():
        how = TPU.get(name)
        step = ("one program" if name == "jax.jit" else "op by op" if name == CPU or not how[1]
                else f"captured, {generation_step.STEPS} tokens a launch")
        rows.append([name, f"{rates[name][0]:,.0f}", f"{rates[name][0] / ref:.2f}x",
                     f"{rates[name][0] / jit:.2f}x", f"{1e3 / rates[name][0]:.2f}",
                     f"{rates[name][1]:,.0f}", f"{r['first'][str(LONG)]:.2f}", step,
                     "yes" if r["tokens"] == cpu[CPU]["tokens"] else "**no**"])
    table = common.markdown_table(
        ["contestant", "decode tokens/s", "vs CPU eager", "vs jax.jit", "ms a token",
         f"whole {LONG}-token call, tokens/s", f"first {LONG}-token call s", "decode step",
         "same tokens as CPU eager"], rows)
    targets = [f"- decode, {n} / CPU eager: {rates[n][0] / ref:.2f}x (target >= {w}x: "
               f"{'met' if rates[n][0] / ref >= w else 'missed'})" for n, w in TARGETS.items()]
    targets.append(f"- decode, captured (generate() in Strict, DeferAndFuse and compiled) / CPU "
                   f"eager: {min(rates[n][0] for n in ('Strict', 'DeferAndFuse', 'compiled')) / ref:.2f}x"
                   f" at the least (target >= 1.5x)")
    targets.append(f"- measured calls compiled {warm['programs']} programs; generate() calls "
                   f"captured {warm['generate_captured']}, op by op {warm['generate_uncaptured']}")
    head = (f"Tiny Llama: hidden {SPEC.hidden}, {SPEC.layers} layers, {SPEC.heads} heads, vocab "
            f"{SPEC.vocab}, fp32, random weights; batch {SPEC.gen_batch}, prompt {SPEC.prompt}, "
            f"greedy. Decode tokens/s = ({LONG} - {SHORT}) tokens / (median {LONG}-token call - "
            f"median {SHORT}-token call): the prefill, generate()'s setup and the copy to the "
            f"host cancel. The tpu contestants and jax.jit share a process and take turns, "
            f"the order rotating; first calls ran in the table's order (the first pays "
            f"one-time setup); CPU eager ran in a process of its own. tpu run {seconds:.0f} s.")
    body = "\n\n".join([head, table, "![decode tokens/s](bench_generate.png)",
                        "Targets (issue 34):\n" + "\n".join(targets),
                        common.notes(out, "generate") if out else ""])
    return body, rates
