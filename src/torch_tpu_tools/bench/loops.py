"""`python -m torch_tpu bench loops`: the loops users write themselves, timed as whole
calls, every eager mode against CPU eager (issue 52).

  - HF generate: `model.generate(prompt, max_new_tokens=32)`, greedy, tiny Llama, batch 1;
  - KV-cache loop: a hand-written greedy loop over the same model with its cache
    (`past_key_values`, `argmax`, `torch.cat` of the tokens), 64 tokens, read at the end;
  - nanoGPT generate: nanoGPT's own `GPT.generate` (a `torch.cat` of each token, `top_k`,
    `multinomial`; top_k=1 so the tokens compare with CPU's), 128 tokens, no cache;
  - train step + read: a small Llama's forward, backward and AdamW step with
    `loss.item()` every step (blocks of STEPS steps).

Each variant runs in a process of its own, one after the other (thread pools spin after
work and skew whatever runs beside them): CPU eager with the device hidden, then Strict and
DeferAndFuse, each with the ATen CPU kernels inside XLA programs (the default on the CPU
platform) and with XLA's own kernels only (`TORCH_TPU_CPU_ATEN_KERNELS=0`; on a TPU only
that setting exists). In a process every loop is called twice to warm up, then ROUNDS times;
the table has medians and the programs built after the warm-up (0 for a loop that repeats),
and every variant's tokens and losses are compared with CPU eager's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from ..workloads import decoder, gpt
from . import common

VARIANTS = {"cpu": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
            "strict": {}, "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"},
            "strict_xla": {"TORCH_TPU_CPU_ATEN_KERNELS": "0"},
            "defer_and_fuse_xla": {"TORCH_TPU_DEFER_AND_FUSE": "1",
                                   "TORCH_TPU_CPU_ATEN_KERNELS": "0"}}
LABELS = {"cpu": "CPU eager", "strict": "Strict", "defer_and_fuse": "DeferAndFuse",
          "strict_xla": "Strict, XLA kernels", "defer_and_fuse_xla": "DeferAndFuse, XLA kernels"}
LOOPS = {"hf_generate": "HF generate, 32 tokens", "kv_loop": "KV-cache loop, 64 tokens",
         "nanogpt_generate": "nanoGPT generate, 128 tokens",
         "train_read": "train step + loss.item()"}
# issue 52: speed against CPU eager (CPU ms / tpu ms), per loop and mode
TARGETS = {("hf_generate", "strict"): 1.5, ("hf_generate", "defer_and_fuse"): 1.5,
           ("kv_loop", "defer_and_fuse"): 1.0, ("nanogpt_generate", "defer_and_fuse"): 1.0,
           ("train_read", "defer_and_fuse"): 1.0}
LLAMA = decoder.DecoderSpec(gen_batch=1, kv_heads=2)
NANO = gpt.GPTSpec(block=256)
STEPS = 10
CHART = "bench_loops.png"


def add_arguments(p) -> None:
    common.add_output_arguments(p)
    p.add_argument("--rounds", type=int, default=7, help="timed calls of each loop (default 7)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)} (cpu is the reference)")
    p.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)


# ---------------------------------------------------------------- the loops, as users write them
def _loops(dev: str) -> dict:
    """name -> a call that runs the loop once on `dev` and returns what it read back."""
    llama = decoder.build_model(LLAMA).to(dev).eval()
    prompt = decoder.prompt_ids(LLAMA).to(dev)

    def hf_generate():
        return llama.generate(prompt, max_new_tokens=32, do_sample=False).cpu().tolist()

    @torch.no_grad()
    def kv_loop(n=64):
        out = llama(prompt, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        toks = [tok]
        for _ in range(n - 1):
            out = llama(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(tok)
        return torch.cat(toks, 1).cpu().tolist()

    nano = gpt.build_model(NANO).to(dev).eval()

    @torch.no_grad()
    def nanogpt_generate(n=128, temperature=0.8, top_k=1):
        idx = torch.zeros((1, 1), dtype=torch.long, device=dev)
        for _ in range(n):  # nanoGPT's GPT.generate
            idx_cond = idx if idx.size(1) <= NANO.block else idx[:, -NANO.block:]
            logits, _ = nano(idx_cond)
            logits = logits[:, -1, :] / temperature
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("Inf")
            probs = torch.nn.functional.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx.cpu().tolist()

    train = decoder.build_model(LLAMA).to(dev)
    opt = decoder.make_optimizer(train, LLAMA)
    batches = [b.to(dev) for b in decoder.learnable_batches(LLAMA, STEPS)]

    def train_read():
        return [decoder.train_step(train, opt, b).item() for b in batches]

    return {"hf_generate": hf_generate, "kv_loop": kv_loop,
            "nanogpt_generate": nanogpt_generate, "train_read": train_read}


def child(variant: str, rounds: int) -> dict:
    dev = "cpu" if variant == "cpu" else "tpu"
    if dev == "tpu":
        import torch_tpu  # noqa: F401  (the device, as a user's script would have it)
    torch.manual_seed(0)
    out = {}
    for name, call in _loops(dev).items():
        first = call()
        call()
        before = common.programs() if dev == "tpu" else 0
        times = []
        for _ in range(rounds):
            time.sleep(1e-3)  # (common.timed: the previous call's worker threads settle)
            t0 = time.perf_counter()
            last = call()
            times.append(time.perf_counter() - t0)
        out[name] = {"ms": 1e3 * common.median(times), "best_ms": 1e3 * min(times),
                     "first": first, "last": last,
                     "late_programs": (common.programs() - before) if dev == "tpu" else 0}
    return out


# ---------------------------------------------------------------- the parent
def _spawn(variant: str, rounds: int) -> dict:
    env = dict(os.environ, TORCH_TPU_RECOMPILE_WARN="0",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), **VARIANTS[variant])
    cmd = [sys.executable, "-m", "torch_tpu", "bench", "loops", "--child", variant,
           "--rounds", str(rounds)]
    return common.run_child(cmd, env, timeout=1800)


def _same(a, b) -> bool:
    """Tokens equal; losses within float32 reordering."""
    if a and isinstance(a[0], float):
        return len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b))
    return a == b


def render(res: dict, seconds: float) -> tuple[str, list[str]]:
    cpu = res.get("cpu", {})
    tpu = [v for v in res if v != "cpu"]
    header = ["loop", "CPU eager ms", *[f"{LABELS[v]} ms" for v in tpu],
              *[f"{LABELS[v]} / CPU" for v in tpu], "programs after warm-up", "values = CPU's"]
    rows, targets = [], []
    for name, label in LOOPS.items():
        ref = cpu.get(name, {})
        cells, ratios, late, same = [], [], [], []
        for v in tpu:
            r = res[v].get(name) if "error" not in res[v] else None
            cells.append(f"{r['ms']:.1f}" if r else f"({res[v].get('error', 'n/a')})"[:80])
            ratio = ref["ms"] / r["ms"] if r and ref else None
            goal = TARGETS.get((name, v))
            mark = "" if goal is None or ratio is None else (" ✓" if ratio >= goal else " (miss)")
            ratios.append("n/a" if ratio is None else f"**{ratio:.2f}x**{mark}")
            if goal is not None and ratio is not None:
                targets.append(f"- {label}, {LABELS[v]}: {ratio:.2f}x CPU eager "
                               f"({'meets' if ratio >= goal else 'misses'} ≥ {goal}x)")
            if r:
                late.append(str(r["late_programs"]))
                same.append("yes" if ref and _same(r["last"], ref["last"]) else "no")
        rows.append([label, f"{ref['ms']:.1f}" if ref else "n/a", *cells, *ratios,
                     " / ".join(late), " / ".join(same)])
    text = [common.markdown_table(header, rows), "",
            f"Whole run: {seconds:.0f} s. Medians of the timed calls; `/ CPU` is CPU eager's "
            "time over the variant's (above 1: faster than CPU). Programs and values per "
            "variant in the order of the columns.", "", *targets]
    return "\n".join(text), tpu


def _chart(res: dict, tpu: list[str]):
    cpu = res.get("cpu", {})

    def draw(path):
        series = {LABELS[v]: [cpu[n]["ms"] / res[v][n]["ms"] if n in cpu and n in res[v]
                              else float("nan") for n in LOOPS] for v in tpu}
        common.bar_chart(path, "Loops users write: speed against CPU eager (higher is better)",
                         list(LOOPS.values()), series, "CPU eager ms / variant ms", log=False)
    return draw


def main(args) -> int:
    if args.child:
        print(common.RESULT + json.dumps(child(args.child, args.rounds)), flush=True)
        return 0
    variants = [v for v in args.variants.split(",") if v]
    t0 = time.perf_counter()
    res = {}
    with common.progress(len(variants), "bench loops") as bar:
        for v in variants:
            bar.set_description(f"bench loops: {LABELS[v]}")
            res[v] = _spawn(v, args.rounds)
            bar.update(1)
    body, tpu = render(res, time.perf_counter() - t0)
    body = "\n\n".join([__doc__.split("\n\n", 1)[1].strip(), body,
                        common.notes(args.out, "loops")])
    print(body)
    if not args.no_write:
        common.publish(args.out, "loops", "Loops users write: whole calls against CPU eager",
                       body, {CHART: _chart(res, tpu)} if tpu and "cpu" in res else None)
    return 0 if all("error" not in r for r in res.values()) else 1
