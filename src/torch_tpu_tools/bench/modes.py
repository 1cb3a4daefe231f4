"""`python -m torch_tpu bench modes`: the eager modes side by side on small HF models.

A small Llama and a small Qwen2 (workloads/decoder.py: random weights, no downloads) run
two workloads in four variants, in one process:
  - train: forward + backward + AdamW, `loss.item()` every step (the usual sync point);
  - infer: `model.generate(do_sample=False)`, prefill + greedy decode of N tokens; the
           first call compiles, so the measured calls are warm ones;
variants: tpu Strict, tpu DeferAndFuse, tpu Debug (NaN checks on, CPU shadow off) and
PyTorch's own CPU eager. Each variant has its own replica of the same initial weights;
after a first (compiling) call and warm-up, the variants take turns round by round, the
order rotating every round, so load from elsewhere on the machine falls on all alike.

Reported: throughput (tokens/s) and its ratios (DeferAndFuse/Strict, DeferAndFuse/CPU,
Debug/Strict); peak device memory per mode (the bytes of realized XLA buffers that
`torch.tpu.max_memory_allocated()` counts: the variant's own resident tensors plus the
peak above them during a call, so the other replicas alive in the process do not count);
the first call's time (compiles); what DeferAndFuse did per step (flushes by trigger, nodes
per flush, graphs compiled once warm: should be none); and the cost of recording one op in
DeferAndFuse (a chain of small ops recorded without a flush, divided by its length) next to
Strict's dispatch and CPU eager.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import time

import torch

from ..workloads import decoder
from . import common, modes_report
from .modes_types import (INFER, KINDS, TRAIN, VARIANTS, AssertsResult, RecordResult,
                          WorkloadResult)

# GQA (2 KV heads), and token 0 pads: HF generate's pad token (workloads/decoder.py)
SPEC = decoder.DecoderSpec(kv_heads=2, pad=0)


def _counters() -> dict:
    from torch_tpu import metrics

    return dict(metrics.counters)


def _diff(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _resident_bytes(tensors) -> int:
    """Bytes of the distinct tpu storages behind `tensors` (weights, grads, AdamW state)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            st = t.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
    return total


# ---------------------------------------------------------------- runners
class Runner:
    """One variant of one workload: its own model replica, and its samples."""

    def __init__(self, base, spec: decoder.DecoderSpec, variant: str, workload: str, asserts=None):
        self.spec, self.variant, self.workload = spec, variant, workload
        self.asserts = asserts  # device-side asserts forced on/off; None: as configured
        self.device = "cpu" if variant == "cpu" else "tpu"
        self.tpu = self.device == "tpu"
        with common.eager(variant):
            self.model = copy.deepcopy(base).to(self.device)
        if workload == TRAIN:
            self.model.train()
            self.opt = decoder.make_optimizer(self.model, spec)
            self.batches = decoder.random_batches(spec, [spec.seq] * 64)
            self.tokens = spec.tokens_per_step
        else:
            self.model.eval()
            self.opt = None
            self.prompt = decoder.prompt_ids(spec)
            self.tokens = spec.infer_tokens
        self.n = 0
        self.seconds: list[float] = []     # measured (warm) samples
        self.host_s = 0.0                  # the last call's CPU time on this thread
        self.host_seconds: list[float] = []  # ... of each measured sample
        self.peaks: list[int] = []         # bytes: own resident + peak above it, per sample
        self.counts: dict = {}             # metrics counters over the measured samples
        self.first_s = float("nan")
        self.first_counts: dict = {}
        self.warm_counts: dict = {}
        self.output = None
        self.losses: list[float] = []

    def resident(self) -> int:
        if not self.tpu:
            return 0
        ts = list(self.model.parameters()) + [p.grad for p in self.model.parameters()]
        if self.opt is not None:
            for st in self.opt.state.values():
                ts.extend(v for v in st.values() if isinstance(v, torch.Tensor))
        return _resident_bytes(ts)

    def _call(self):
        if self.workload == TRAIN:
            ids = self.batches[self.n % len(self.batches)]
            self.n += 1
            ids = ids.to(self.device)
            loss = self.model(input_ids=ids, labels=ids).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.losses.append(loss.item())
        else:
            out = self.model.generate(self.prompt.to(self.device), max_new_tokens=self.spec.new_tokens,
                                      do_sample=False, pad_token_id=0)
            self.output = out.cpu()

    def run(self) -> tuple[float, int, dict]:
        """One timed call -> (seconds, peak device bytes, metrics counters it moved)."""
        time.sleep(1e-3)  # let the previous contestant's worker threads stop spinning
        with common.eager(self.variant), _asserts_forced(self.asserts):
            if self.tpu:
                torch.tpu.synchronize()
                torch.tpu.reset_peak_memory_stats()
                base = torch.tpu.memory_allocated()
                own = self.resident()
            c0 = _counters()
            t0, h0 = time.perf_counter(), time.thread_time()
            self._call()  # ends in a host read (loss.item() / out.cpu()): synchronized
            self.host_s = time.thread_time() - h0  # this thread's CPU time: steady under load
            dt = time.perf_counter() - t0
            c1 = _counters()
            peak = torch.tpu.max_memory_allocated() - base + own if self.tpu else 0
        return dt, peak, _diff(c1, c0)

    def first(self) -> None:
        self.first_s, _, self.first_counts = self.run()

    def warm(self, n: int) -> None:
        for _ in range(n):
            _, _, c = self.run()
            for k, v in c.items():
                self.warm_counts[k] = self.warm_counts.get(k, 0) + v

    def sample(self) -> float:
        dt, peak, c = self.run()
        self.seconds.append(dt)
        self.host_seconds.append(self.host_s)
        self.peaks.append(peak)
        for k, v in c.items():
            self.counts[k] = self.counts.get(k, 0) + v
        return dt

    def close(self) -> None:
        self.model = self.opt = None


def measure(base, kind: str, workload: str, spec: decoder.DecoderSpec, variants=VARIANTS, rounds: int = 5,
            warmup: int = 1, progress=None) -> WorkloadResult:
    """First call, `warmup` calls, then `rounds` interleaved calls of each variant."""
    from torch_tpu import metrics

    res = WorkloadResult(kind, workload, spec.tokens_per_step if workload == TRAIN else spec.infer_tokens)
    runners = {}
    n_reasons = len(metrics.recompile_reasons)
    for v in variants:  # first calls in the order given: Strict pays the shared op analysis
        try:
            r = Runner(base, spec, v, workload)
            r.first()
            r.warm(warmup)
            runners[v] = r
        except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
            res.errors[v] = common.one_line(e)
        if progress is not None:
            progress.update(1)

    def guarded(r):
        def one():
            try:
                return r.sample()
            except Exception as e:  # noqa: BLE001
                res.errors[r.variant] = common.one_line(e)
                runners.pop(r.variant, None)
                return float("nan")
        return one

    live = dict(runners)
    common.interleaved({v: guarded(r) for v, r in live.items()}, rounds, progress)
    ref = runners.get("cpu")
    for v, r in live.items():
        ok = [s for s in r.seconds if s == s]
        if v in res.errors or not ok:
            continue
        res.seconds[v] = common.median(ok)
        res.best[v] = min(ok)
        res.samples[v] = len(ok)
        res.first_s[v] = r.first_s
        res.first_counts[v] = r.first_counts
        res.warm_counts[v] = r.warm_counts
        res.counts[v] = r.counts
        if r.tpu:
            res.peak[v] = max(r.peaks)
            res.resident[v] = r.resident()
        if ref is not None and v != "cpu":
            if workload == INFER:
                res.agree[v] = bool(torch.equal(r.output, ref.output))
            else:
                a, b = torch.tensor(r.losses), torch.tensor(ref.losses)
                res.agree[v] = bool(a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-4))
    res.reasons = list(metrics.recompile_reasons[n_reasons:])
    for r in runners.values():
        r.close()
    runners.clear()
    live.clear()
    gc.collect()
    return res


# ---------------------------------------------------------------- device-side asserts
def _asserts_forced(on):
    from torch_tpu.op import asserts

    return asserts.forced(on)


def measure_asserts(base, spec: decoder.DecoderSpec, rounds: int, warmup: int = 2, progress=None) -> AssertsResult:
    """The training step of `base` in Strict and DeferAndFuse, each with device-side asserts
    on and off: four replicas, interleaved round by round like `measure`."""
    res = AssertsResult(rounds)
    runners = {}
    for mode in ("strict", "defer_and_fuse"):
        for on in (True, False):
            try:
                r = Runner(base, spec, mode, TRAIN, asserts=on)
                r.first()
                r.warm(warmup)
                runners[(mode, on)] = r
            except Exception as e:  # noqa: BLE001  (reported, not hidden)
                res.errors[mode] = common.one_line(e)
    live = {k: r.sample for k, r in runners.items() if k[0] not in res.errors}
    common.interleaved(live, rounds, progress)
    for mode in ("strict", "defer_and_fuse"):
        if mode not in res.errors:
            on, off = runners[(mode, True)], runners[(mode, False)]
            res.samples[mode] = (on.seconds, off.seconds)
            res.host[mode] = (on.host_seconds, off.host_seconds)
    for r in runners.values():
        r.close()
    gc.collect()
    return res


# ---------------------------------------------------------------- per-op recording cost
def _chain(x, b, n):
    """`n` small ops, four different ones in turn (shorter than loop detection's minimum
    period, so recording them never triggers a flush)."""
    for _ in range(n // 4):
        x = x + b
        x = x * b
        x = torch.tanh(x)
        x = x - b
    return x


def measure_record(n_ops: int = 1000, rounds: int = 9, progress=None) -> RecordResult:
    """µs per op: DeferAndFuse recording (no flush inside the timer) and the flush that
    follows (a cache hit, amortized per op), Strict dispatch (returns before the op runs)
    and Strict dispatch + the final synchronize, CPU eager."""
    import torch_tpu
    from torch_tpu import metrics

    res = RecordResult(n_ops)
    g = torch.Generator().manual_seed(0)
    xc, bc = torch.randn(16, generator=g), torch.randn(16, generator=g)
    xt, bt = xc.to("tpu"), bc.to("tpu")
    samples = {k: [] for k in ("defer_record", "defer_flush", "strict_dispatch", "strict_total", "cpu")}

    def flushes():
        return sum(v for k, v in metrics.counters.items() if k.startswith("flush."))

    def defer():
        with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
            time.sleep(1e-3)
            f0 = flushes()
            t0 = time.perf_counter()
            y = _chain(xt, bt, n_ops)
            t1 = time.perf_counter()
            res.flushed_while_recording += flushes() - f0
            torch_tpu.sync()
            t2 = time.perf_counter()
            del y
        samples["defer_record"].append((t1 - t0) / n_ops)
        samples["defer_flush"].append((t2 - t1) / n_ops)
        return t2 - t0

    def strict():
        with torch_tpu.eager_mode(torch_tpu.EagerMode.STRICT):
            torch_tpu.sync()
            time.sleep(1e-3)
            t0 = time.perf_counter()
            y = _chain(xt, bt, n_ops)
            t1 = time.perf_counter()
            torch_tpu.sync()
            t2 = time.perf_counter()
            del y
        samples["strict_dispatch"].append((t1 - t0) / n_ops)
        samples["strict_total"].append((t2 - t0) / n_ops)
        return t2 - t0

    def cpu():
        time.sleep(1e-3)
        t0 = time.perf_counter()
        _chain(xc, bc, n_ops)
        dt = time.perf_counter() - t0
        samples["cpu"].append(dt / n_ops)
        return dt

    fns = {"defer": defer, "strict": strict, "cpu": cpu}
    for name, fn in fns.items():  # compile (the fused chain, the four Strict ops) first
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            res.errors[name] = common.one_line(e)
    for k in samples:
        samples[k].clear()
    res.flushed_while_recording = 0
    live = {k: v for k, v in fns.items() if k not in res.errors}
    common.interleaved(live, rounds, progress)
    res.us = {k: common.median(v) * 1e6 for k, v in samples.items() if v}
    res.us_best = {k: min(v) * 1e6 for k, v in samples.items() if v}
    return res


# ---------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    # enough samples that a median is steady on a noisy shared machine (~1 min in all)
    p.add_argument("--train-rounds", type=int, default=40,
                   help="interleaved training steps per variant (default 40)")
    p.add_argument("--infer-rounds", type=int, default=8,
                   help="interleaved generate calls per variant (default 8)")
    p.add_argument("--new-tokens", type=int, default=SPEC.new_tokens,
                   help=f"greedy tokens per generate call (default {SPEC.new_tokens})")
    p.add_argument("--record-ops", type=int, default=1000,
                   help="ops in the recording-cost chain (default 1000)")
    p.add_argument("--record-rounds", type=int, default=21,
                   help="interleaved rounds of the recording-cost chain (default 21)")
    p.add_argument("--asserts-rounds", type=int, default=40,
                   help="interleaved Llama training steps per variant with device-side asserts "
                        "on and off (default 40; 0 skips)")
    p.add_argument("--models", default=",".join(KINDS), help="comma list of llama,qwen2")
    p.add_argument("--workloads", default=f"{TRAIN},{INFER}", help="comma list of train,infer")
    common.add_output_arguments(p, "PERFORMANCE.md and the charts")


def main(args) -> int:
    import torch_tpu  # noqa: F401  (registers the device)

    t_start = time.perf_counter()
    spec = dataclasses.replace(SPEC, new_tokens=args.new_tokens)
    kinds = [k for k in args.models.split(",") if k]
    workloads = [w for w in args.workloads.split(",") if w]
    rounds = {TRAIN: args.train_rounds, INFER: args.infer_rounds, "record": args.record_rounds}
    rounds["asserts"] = args.asserts_rounds if "llama" in kinds and TRAIN in workloads else 0
    total = (sum(len(VARIANTS) + rounds[w] for _ in kinds for w in workloads)
             + args.record_rounds + rounds["asserts"])
    results = []
    asserts = None
    with common.progress(total, "bench modes") as bar:
        for kind in kinds:
            base = decoder.build_model(spec, kind)
            for w in workloads:
                bar.set_description(f"bench modes: {kind} {w}")
                results.append(measure(base, kind, w, spec, VARIANTS, rounds[w],
                                       warmup=2 if w == TRAIN else 1, progress=bar))
            if kind == "llama" and rounds["asserts"]:
                bar.set_description("bench modes: llama train, device-side asserts on/off")
                asserts = measure_asserts(base, spec, rounds["asserts"], progress=bar)
        bar.set_description("bench modes: per-op cost")
        rec = measure_record(args.record_ops, args.record_rounds, bar)
    text = modes_report.render(results, rec, spec, rounds, time.perf_counter() - t_start,
                               asserts, common.notes(args.out, "modes"))
    print(text)
    if not args.no_write:
        common.publish(args.out, "modes", "Eager modes: Strict vs DeferAndFuse vs Debug vs CPU "
                       "eager (small Llama and Qwen2)", text,
                       {"bench_modes.png": lambda path: modes_report.throughput_chart(results, path),
                        "bench_modes_memory.png": lambda path: modes_report.memory_chart(results, path)})
    return 0
