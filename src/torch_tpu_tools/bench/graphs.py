"""`python -m torch_tpu bench graphs`: capture and replay (torch.tpu.graph) against the
eager modes and CPU eager, where host overhead decides: a small Llama's training step and
a tiny Llama's decode step.

  - train: HF Llama (hidden 128, 4 layers, 4 heads, 2 KV heads), batch 4 x 64, AdamW,
    `loss.item()` every step (the usual logging sync); the captured variant is the CUDA
    graphs recipe: AdamW(capturable=True), forward + backward + step captured, each step
    a copy of the batch into the static input and one replay;
  - decode: HF Llama (hidden 64, 2 layers) over a StaticCache, one greedy token per step,
    tokens kept on the device (`out.index_copy_`), a sync at the end of each block.

Variants: tpu Strict, tpu DeferAndFuse, captured (replayed; capture made in Strict), and CPU
eager in a process of its own (thread pools spin after work, skewing what runs beside
them). The tpu variants share one process, each with its own replica of the same
weights, and take turns block by block, the order rotating. Reported: warm medians per
block, first-block seconds (compiles) apart, the ratios the issue names, and the
captured variant's largest loss (train) or token (decode) difference from Strict's.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

from ..workloads import decoder
from . import common

TRAIN_SPEC = decoder.DecoderSpec(hidden=128, layers=4, heads=4, kv_heads=2, seq=64, batch=4)
DECODE_SPEC = decoder.DecoderSpec(pad=0)
VARIANTS = ("strict", "defer_and_fuse", "captured")
STEPS, TOKENS, CACHE = 4, 16, 64   # train steps / decode tokens per block; cache length


def add_arguments(p) -> None:
    common.add_output_arguments(p)
    p.add_argument("--rounds", type=int, default=6, help="measured blocks per variant")
    p.add_argument("--child", choices=["cpu"], help=argparse.SUPPRESS)


# ---------------------------------------------------------------- the two workloads
class Train:
    def __init__(self, base, device, captured):
        self.device = device
        self.model = copy.deepcopy(base).to(device).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=TRAIN_SPEC.lr,
                                     capturable=captured)
        self.batches = decoder.random_batches(TRAIN_SPEC, [TRAIN_SPEC.seq] * 8)
        self.ids = self.batches[0].to(device)
        self.graph, self.losses, self.i = None, [], 0
        for _ in range(2):  # every variant alike: warm-up (AdamW's state exists after it)
            self._step()
        if captured:  # the recipe: gradients made inside the region, not accumulated
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(self.graph):
                self.loss = self._step(zero=False)

    def _step(self, zero=True):
        if zero:
            self.opt.zero_grad(set_to_none=True)
        loss = self.model(input_ids=self.ids, labels=self.ids, use_cache=False).loss
        loss.backward()
        self.opt.step()
        return loss.detach()

    def block(self):
        for _ in range(STEPS):
            self.ids.copy_(self.batches[self.i % len(self.batches)])
            self.i += 1
            if self.graph is not None:
                self.graph.replay()
                self.losses.append(self.loss.item())
            else:
                self.losses.append(self._step().item())


class Decode:
    def __init__(self, base, device, captured):
        from transformers import StaticCache

        self.model = copy.deepcopy(base).to(device).eval()
        self.cache = StaticCache(config=self.model.config, max_cache_len=CACHE)
        self.tok = torch.tensor([[3]], device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.out = torch.zeros(CACHE, dtype=torch.long, device=device)
        self.device, self.graph, self.losses = device, None, []
        self._step()  # every variant alike (the cache's buffers exist after it)
        if captured:
            self.graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(self.graph):
                self._step()

    @torch.no_grad()
    def _step(self):
        logits = self.model(input_ids=self.tok, cache_position=self.pos, past_key_values=self.cache,
                            use_cache=True).logits
        nxt = logits[:, -1].argmax(-1)
        self.out.index_copy_(0, self.pos, nxt)
        self.tok.copy_(nxt.view(1, 1))
        self.pos.add_(1)

    def block(self):
        self.pos.zero_()
        self.tok.fill_(3)
        for layer in self.cache.layers:  # (StaticLayer counts its own positions)
            layer.cumulative_length.zero_()
        for _ in range(TOKENS):
            self.graph.replay() if self.graph is not None else self._step()
        self.losses = self.out[:TOKENS].tolist()  # the block's sync


WORKLOADS = {"train": (Train, TRAIN_SPEC, STEPS * TRAIN_SPEC.tokens_per_step),
             "decode": (Decode, DECODE_SPEC, TOKENS)}


def _measure(variants: dict, rounds: int, bar) -> dict:
    """name -> {first, warm (median block seconds), losses (of the first block: later ones
    drift apart, as AdamW's capturable and plain forms round differently)}."""
    res = {}
    for name, make in variants.items():
        t0 = time.perf_counter()
        with common.eager("strict" if name == "captured" else name):
            runner = make()
            runner.block()
        res[name] = {"first": time.perf_counter() - t0, "runner": runner,
                     "losses": list(runner.losses)}

    def timed(name):
        def run():
            with common.eager("strict" if name == "captured" else name):
                t0 = time.perf_counter()
                res[name]["runner"].block()
                return time.perf_counter() - t0
        return run

    samples = common.interleaved({n: timed(n) for n in variants}, rounds, bar)
    for name in variants:
        res[name].update(warm=common.median(samples[name]))
        del res[name]["runner"]
    return res


def _run(device: str, rounds: int, bar=None) -> dict:
    out = {}
    for kind, (cls, spec, _) in WORKLOADS.items():
        base = decoder.build_model(spec)
        names = ("cpu",) if device == "cpu" else VARIANTS
        out[kind] = _measure({n: (lambda n=n: cls(base, device, n == "captured")) for n in names},
                             rounds, bar)
    return out


def main(args) -> int:
    if args.child == "cpu":
        print(common.RESULT + json.dumps(_run("cpu", args.rounds)))
        return 0
    cpu = common.run_child([sys.executable, "-m", "torch_tpu", "bench", "graphs", "--child", "cpu",
                            "--rounds", str(args.rounds)], dict(os.environ), 1800)
    if "error" in cpu:
        print(cpu["error"])
        return 1
    import torch_tpu  # noqa: F401

    with common.progress(2 * args.rounds, "bench graphs") as bar:
        tpu = _run("tpu", args.rounds, bar)
    body = _report(tpu, cpu, args.out)
    print(body)
    if not args.no_write:
        common.publish(args.out, "graphs", "Capture and replay: torch.tpu.graph against the eager "
                       "modes and CPU eager", body)
    return 0


def _report(tpu: dict, cpu: dict, out=None) -> str:
    rows, targets = [], []
    for kind, (_, spec, units) in WORKLOADS.items():
        rate = {n: units / r["warm"] for n, r in {**tpu[kind], **cpu[kind]}.items()}
        diff = max(abs(a - b) for a, b in zip(tpu[kind]["captured"]["losses"],
                                               tpu[kind]["strict"]["losses"]))
        for n in ("cpu", *VARIANTS):
            r = {**tpu[kind], **cpu[kind]}[n]
            rows.append([kind, n, f"{r['warm'] * 1e3:.1f}", f"{rate[n]:,.0f}",
                         f"{rate[n] / rate['cpu']:.2f}x", f"{rate[n] / rate['strict']:.2f}x",
                         f"{r['first']:.2f}", f"{diff:.2g}" if n == "captured" else ""])
        want = ({"strict": 1.0, "defer_and_fuse": 1.5, "captured": 1.5} if kind == "decode"
                else {"defer_and_fuse": 1.2, "captured": 1.5})
        for n, w in want.items():
            got = rate[n] / rate["cpu"]
            targets.append(f"- {kind}, {n} / CPU eager: {got:.2f}x (target >= {w}x: "
                           f"{'met' if got >= w else 'missed'})")
        if kind == "train":
            got = rate["defer_and_fuse"] / rate["strict"]
            targets.append(f"- train, DeferAndFuse / Strict: {got:.2f}x (target >= 2.0x: "
                           f"{'met' if got >= 2.0 else 'missed'})")
    table = common.markdown_table(
        ["workload", "variant", "block ms (median)", "tokens/s", "vs CPU eager", "vs Strict",
         "first block s", "captured vs Strict, first block's max diff"], rows)
    return "\n\n".join([
        f"train: Llama hidden {TRAIN_SPEC.hidden}, {TRAIN_SPEC.layers} layers, batch "
        f"{TRAIN_SPEC.batch} x {TRAIN_SPEC.seq}, AdamW; blocks of {STEPS} steps, `loss.item()` each, "
        f"after 2 warm-up steps. decode: Llama hidden {DECODE_SPEC.hidden}, {DECODE_SPEC.layers} "
        f"layers, batch 1; blocks of {TOKENS} greedy tokens over a StaticCache of {CACHE}.",
        table, "Targets (issue 34):\n" + "\n".join(targets), common.notes(out, "graphs") if out else ""])
