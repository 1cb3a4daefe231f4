"""`python -m torch_tpu bench scaling`: how the ratios move as the Llama grows.

A sweep over the model's width (hidden size) and the tokens per call (batch x sequence),
for two workloads of the same HF `LlamaForCausalLM` (2 layers, vocab 256, intermediate
2 x width, head size 16-64):
  - train:    forward, backward and AdamW (workloads/decoder.py's workload);
  - generate: greedy `model.generate(max_new_tokens=N)` of a batch of prompts, N fixed
              and small (default 8), so prefill dominates the large cells and the decode
              steps' dispatch the small ones;
each across the contestants of `bench compile` (whose runners this module reuses):
tpu Strict, tpu DeferAndFuse, tpu compiled (`torch.compile(backend="tpu")`; for
generation HF's own compiled decoding: static cache and `compile_config`), CPU eager,
CPU inductor (the same with inductor) and a hand-written `jax.jit` (the whole step, or the
whole greedy generation with a KV cache, as one program): the limit on XLA.

Each cell builds its contestants on the same initial weights, runs a first (compiling)
call and warm-up, then times them interleaved round by round (common.interleaved). The
repeats adapt to the cell: each sample is a batch of calls of at least ~50 ms, and the
rounds fill a per-cell budget (`--cell-seconds`), at least `--min-rounds`. Reported: ms
per call, the ratios to CPU eager and to jax.jit, the model's FLOPs per call (matmuls,
counted below), a plot of ratio vs FLOPs, and where each mode crosses CPU eager.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import time

import torch

from .. import workloads
from ..workloads import decoder
from . import common, scaling_report
from .compile import TRAIN, JaxRunner, TorchRunner
from .scaling_report import SHORT

GEN = "generate"
WORKLOADS = (TRAIN, GEN)
CONTESTANTS = ("tpu Strict", "tpu DeferAndFuse", "tpu compiled", "CPU eager", "CPU inductor",
               "jax.jit")
WIDTHS = (64, 256, 512, 1024)
SHAPES = ((4, 32), (8, 64), (16, 256))         # batch x seq: 128, 512 and 4096 tokens
# The default grid is sparse: every cell costs each contestant its compiles (~1-2 min for
# the six on 2 shared cores, inductor's the longest), so a full product would take an
# hour. 128 tokens at every width, 4096 up to width 512, 512 at width 1024; the corner
# (1024 x 4096 tokens, ~0.5 TFLOP per training step) takes 10-20 s per CPU step.
CELLS = ((64, (4, 32)), (64, (16, 256)), (256, (4, 32)), (256, (16, 256)),
         (512, (4, 32)), (512, (16, 256)), (1024, (4, 32)), (1024, (8, 64)))
QUICK_CELLS = ((64, (4, 32)), (256, (8, 64)))
SAMPLE_S = 0.05   # a sample is a batch of calls at least this long (timer noise)


def spec_for(width: int, batch: int, seq: int, new_tokens: int = 8) -> decoder.DecoderSpec:
    """A cell's Llama; generation prompts it with its whole batch x seq."""
    return decoder.DecoderSpec(hidden=width, heads=max(4, width // 64), batch=batch, seq=seq,
                               gen_batch=batch, prompt=seq, new_tokens=new_tokens)


# ---------------------------------------------------------------- model FLOPs
def _forward_flops(spec, b: int, s: int, ctx: int, logits: int) -> int:
    """Matmul FLOPs of one forward of `b` x `s` new tokens attending to `ctx` positions,
    with `logits` positions through the LM head: 2 per multiply-add, the projections
    (q, k, v, o; gate, up, down) and the attention (q k^T and p v, dense)."""
    h, inter, layers = spec.hidden, 2 * spec.hidden, spec.layers
    proj = layers * (4 * h * h + 3 * h * inter)
    return 2 * b * (s * proj + logits * h * spec.vocab + layers * 2 * s * ctx * h)


def flops(spec, workload: str, new_tokens: int) -> int:
    """Model FLOPs per call: training is 3x the forward (backward: twice the forward);
    generation is the prefill plus `new_tokens - 1` one-token decode steps, the LM head
    on the last position only (HF's `logits_to_keep`). AdamW and norms are left out."""
    b, s = spec.batch, spec.seq
    if workload == TRAIN:
        return 3 * _forward_flops(spec, b, s, s, s)
    return (_forward_flops(spec, b, s, s, 1)
            + sum(_forward_flops(spec, b, 1, s + i, 1) for i in range(1, new_tokens)))


# ---------------------------------------------------------------- generation runners
def jax_generate(model, new_tokens: int):
    """(params, generate) of a hand-written JAX greedy generation equal to HF's Llama
    `generate(do_sample=False)`: one jitted program, prefill then a `fori_loop` of decode
    steps over a preallocated KV cache (prompt + new_tokens long, masked by position)."""
    import jax
    import jax.numpy as jnp

    params, _, _, cached = decoder.jax_llama_math(model)
    cfg = model.config
    layers, nh = cfg.num_hidden_layers, cfg.num_attention_heads
    hd = cfg.hidden_size // nh

    def generate(p, prompt):
        b, n = prompt.shape
        cache = jnp.zeros((layers, b, nh, n + new_tokens, hd), jnp.float32)
        logits, ck, cv = cached(p, prompt, 0, cache, cache)
        tok = jnp.argmax(logits, -1).astype(prompt.dtype)
        out = jnp.zeros((b, new_tokens), prompt.dtype).at[:, 0].set(tok)

        def decode(i, carry):
            tok, ck, cv, out = carry
            logits, ck, cv = cached(p, tok[:, None], n + i - 1, ck, cv)
            tok = jnp.argmax(logits, -1).astype(prompt.dtype)
            return tok, ck, cv, out.at[:, i].set(tok)

        out = jax.lax.fori_loop(1, new_tokens, decode, (tok, ck, cv, out))[3]
        return jnp.concatenate([prompt, out], 1)

    return params, jax.jit(generate)


class JaxGenRunner:
    def __init__(self, base, new_tokens: int):
        import jax

        self.jax = jax
        self.params, self.generate = jax_generate(base, new_tokens)

    def step(self, prompt):
        out = self.generate(self.params, self.jax.device_put(prompt.numpy().astype("int32")))
        return torch.from_numpy(self.jax.device_get(out).copy()).long()  # the tokens, on the host

    def sync(self):
        pass  # step() ends in the host copy of the tokens


class TorchGenRunner:
    """`model.generate` greedy, as a user writes it: the default dynamic cache in eager;
    compiled, HF's static cache and `compile_config` (HF compiles the decode steps, the
    prefill runs eagerly)."""

    def __init__(self, base, device, new_tokens, mode=None, compile_backend=None):
        from transformers import CompileConfig

        self.device, self.mode = device, mode
        self.model = workloads.replicate(base, device).eval()
        self.kw = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
        if compile_backend is not None:
            cc = CompileConfig(backend=compile_backend, mode="default")
            cc._compile_all_devices = device == "cpu"  # HF compiles on accelerators only
            self.kw.update(cache_implementation="static", compile_config=cc)

    def step(self, prompt):
        with common.eager(self.mode), torch.no_grad():
            return self.model.generate(prompt.to(self.device), **self.kw).cpu()

    def sync(self):
        pass  # step() ends in the host copy of the tokens


class TrainRunner:
    """`bench compile`'s runner (torch or JAX) of the training step, as step(ids)."""

    def __init__(self, runner):
        self.runner = runner

    def step(self, ids):
        return self.runner.step(ids, TRAIN)

    def sync(self):
        self.runner.sync()


def contestants(base, spec, workload, new_tokens, names):
    """name -> a zero-argument factory of a runner with step(input) and sync()."""
    if workload == TRAIN:
        make = {
            "tpu Strict": lambda: TorchRunner(base, spec, "tpu", TRAIN, mode="strict"),
            "tpu DeferAndFuse": lambda: TorchRunner(base, spec, "tpu", TRAIN, mode="defer_and_fuse"),
            "tpu compiled": lambda: TorchRunner(base, spec, "tpu", TRAIN, compile_backend="tpu"),
            "CPU eager": lambda: TorchRunner(base, spec, "cpu", TRAIN),
            "CPU inductor": lambda: TorchRunner(base, spec, "cpu", TRAIN, compile_backend="inductor"),
            "jax.jit": lambda: JaxRunner(base, spec),
        }
        return {n: (lambda m=make[n]: TrainRunner(m())) for n in names}
    make = {
        "tpu Strict": lambda: TorchGenRunner(base, "tpu", new_tokens, mode="strict"),
        "tpu DeferAndFuse": lambda: TorchGenRunner(base, "tpu", new_tokens, mode="defer_and_fuse"),
        "tpu compiled": lambda: TorchGenRunner(base, "tpu", new_tokens, compile_backend="tpu"),
        "CPU eager": lambda: TorchGenRunner(base, "cpu", new_tokens),
        "CPU inductor": lambda: TorchGenRunner(base, "cpu", new_tokens, compile_backend="inductor"),
        "jax.jit": lambda: JaxGenRunner(base, new_tokens),
    }
    return {n: make[n] for n in names}


# ---------------------------------------------------------------- one cell
@dataclasses.dataclass
class Cell:
    workload: str
    width: int
    batch: int
    seq: int
    flops: int
    ms: dict = dataclasses.field(default_factory=dict)       # name -> median ms per call
    first_s: dict = dataclasses.field(default_factory=dict)  # name -> first call (compiles)
    reps: dict = dataclasses.field(default_factory=dict)     # name -> calls per sample
    rounds: int = 0
    errors: dict = dataclasses.field(default_factory=dict)
    disagree: list = dataclasses.field(default_factory=list)  # generate: tokens != CPU eager's

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def ratio(self, name: str, ref: str) -> float:
        a, b = self.ms.get(name), self.ms.get(ref)
        return b / a if a and b else float("nan")


def measure_cell(workload, width, batch, seq, names, new_tokens, cell_s, min_rounds, bar) -> Cell:
    spec = spec_for(width, batch, seq, new_tokens)
    cell = Cell(workload, width, batch, seq, flops(spec, workload, new_tokens))
    base = decoder.build_model(spec)
    if workload == TRAIN:
        inputs = decoder.learnable_batches(spec, 8)
    else:
        base.eval()
        inputs = [decoder.prompt_ids(spec)]
    torch._dynamo.reset()  # each cell compiles afresh: no automatic dynamic across widths
    runners, est, outputs = {}, {}, {}
    for name, make in contestants(base, spec, workload, new_tokens, names).items():
        bar.set_description(f"bench scaling: {workload} width {width} {batch}x{seq}: {SHORT[name]}")
        try:
            torch.manual_seed(0)
            r = make()
            t0 = time.perf_counter()
            out = r.step(inputs[0])
            r.sync()
            cell.first_s[name] = time.perf_counter() - t0
            # steady state: AdamW's state exists, DeferAndFuse's graph with the optimizer
            # step in it, the compiled paths' second-call recompiles done
            for i in range(1 if cell.first_s[name] > 5 else 2):
                t0 = time.perf_counter()
                out = r.step(inputs[(i + 1) % len(inputs)])
                r.sync()
                est[name] = time.perf_counter() - t0
            outputs[name] = out
            runners[name] = r
        except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
            cell.errors[name] = common.one_line(e, 140)
        bar.update(1)
    if workload == GEN and "CPU eager" in outputs:
        cell.disagree = [n for n, o in outputs.items() if not torch.equal(o, outputs["CPU eager"])]
    # repeats: a sample of >= SAMPLE_S, rounds filling the cell's budget
    cell.reps = {n: max(1, math.ceil(SAMPLE_S / est[n])) for n in runners}
    per_round = sum(cell.reps[n] * est[n] for n in runners) or 1.0
    cell.rounds = max(min_rounds, min(25, int(cell_s / per_round)))

    def timer(name, r):
        it = iter(inputs * (cell.rounds * cell.reps[name] + 1))
        return lambda: common.timed(lambda: r.step(next(it)), cell.reps[name], r.sync)

    def guarded(name, fn):
        def one():
            try:
                return fn()
            except Exception as e:  # noqa: BLE001
                cell.errors[name] = common.one_line(e, 140)
                return float("nan")
        return one

    bar.set_description(f"bench scaling: {workload} width {width} {batch}x{seq}: "
                        f"{cell.rounds} interleaved rounds")
    samples = common.interleaved({n: guarded(n, timer(n, r)) for n, r in runners.items()},
                                 cell.rounds)
    for n, xs in samples.items():
        ok = [x for x in xs if not math.isnan(x)]
        if n not in cell.errors and ok:
            cell.ms[n] = common.median(ok) * 1e3
    bar.update(1)
    runners.clear()
    gc.collect()
    return cell


# ---------------------------------------------------------------- the sweep
def grid(widths, shapes, quick: bool):
    """(width, (batch, seq)) cells: the product of the given widths and shapes (either
    defaulting to the full list), else the default or quick grid."""
    if widths or shapes:
        return [(w, s) for w in widths or WIDTHS for s in shapes or SHAPES]
    return list(QUICK_CELLS if quick else CELLS)


def run(cells, workloads, names, new_tokens, cell_s, min_rounds, bar) -> list[Cell]:
    out = []
    for w in workloads:
        for width, (b, s) in cells:
            out.append(measure_cell(w, width, b, s, names, new_tokens, cell_s, min_rounds, bar))
    return out


# ---------------------------------------------------------------- kernels: XLA:CPU vs torch
def gemm_shapes(spec) -> dict:
    """(m, k, n) -> count of the training step's linear-layer matmuls: each linear's
    forward X W^T and its backward dY W and dY^T X (attention's batched matmuls left out)."""
    t, h, i = spec.tokens_per_step, spec.hidden, 2 * spec.hidden
    linears = [(t, h, h)] * 4 + [(t, h, i)] * 2 + [(t, i, h)]
    out: dict = {}
    for m, k, n in linears * spec.layers + [(t, spec.hidden, spec.vocab)]:
        for shape in ((m, k, n), (m, n, k), (n, m, k)):
            out[shape] = out.get(shape, 0) + 1
    return out


def _gemm_timer(fn, reps, cores):
    """One sample: seconds per call over `reps` calls of `fn(reps)`; appends the cores kept
    busy (process CPU time / wall time) to `cores`."""
    def one():
        time.sleep(1e-3)  # the other contestant's thread pool goes quiet
        c0, t0 = time.process_time(), time.perf_counter()
        fn(reps)
        dt = time.perf_counter() - t0
        cores.append((time.process_time() - c0) / dt)
        return dt / reps
    return one


def _torch_mm(a, b):
    def run(reps):
        for _ in range(reps):
            torch.mm(a, b)
    return run


def _xla_dot(dot, a, b):
    def run(reps):
        for _ in range(reps):  # queued asynchronously; the last one's wait covers all
            out = dot(a, b)
        out.block_until_ready()
    return run


def profile_gemms(width, batch, seq, rounds=7) -> str:
    """The training step's matmuls one by one, `torch.mm` on CPU against a jitted
    `jnp.dot` on XLA:CPU (fp32, interleaved): ms each, summed over the step, and the cores
    each kept busy."""
    import jax
    import jax.numpy as jnp

    spec = spec_for(width, batch, seq)
    dot = jax.jit(jnp.dot)
    rows, total = [], {"torch": 0.0, "xla": 0.0}
    for (m, k, n), count in sorted(gemm_shapes(spec).items()):
        a, b = torch.randn(m, k), torch.randn(k, n)
        ja, jb = jnp.asarray(a.numpy()), jnp.asarray(b.numpy())
        dot(ja, jb).block_until_ready()
        reps = max(1, int(2e8 / (2 * m * k * n)))  # a sample of ~0.2 GFLOP
        cores = {"torch": [], "xla": []}
        samples = common.interleaved(
            {"torch": _gemm_timer(_torch_mm(a, b), reps, cores["torch"]),
             "xla": _gemm_timer(_xla_dot(dot, ja, jb), reps, cores["xla"])}, rounds)
        ms = {x: common.median(v) * 1e3 for x, v in samples.items()}
        for x in total:
            total[x] += count * ms[x]
        rows.append([f"{m}x{k} @ {k}x{n}", count, f"{ms['torch']:.3f}", f"{ms['xla']:.3f}",
                     f"{ms['xla'] / ms['torch']:.2f}x", f"{common.median(cores['torch']):.1f}",
                     f"{common.median(cores['xla']):.1f}"])
    rows.append(["the step's linears, summed", sum(gemm_shapes(spec).values()),
                 f"{total['torch']:.2f}", f"{total['xla']:.2f}",
                 f"{total['xla'] / total['torch']:.2f}x", "", ""])
    return (f"Training-step matmuls at width {width}, {batch}x{seq} (fp32, median of {rounds} "
            "interleaved batches; cores: process CPU time / wall time):\n\n"
            + common.markdown_table(["matmul", "per step", "torch.mm ms", "XLA:CPU dot ms",
                                     "XLA / torch", "torch cores", "XLA cores"], rows))


# ---------------------------------------------------------------- CLI
def _shape(text: str) -> tuple:
    b, s = text.lower().split("x")
    return int(b), int(s)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="a small grid: " + ", ".join(f"width {w} x {b}x{s}" for w, (b, s) in QUICK_CELLS))
    p.add_argument("--widths", type=lambda t: tuple(int(x) for x in t.split(",")), default=None,
                   help=f"comma list of widths (default {','.join(map(str, WIDTHS))})")
    p.add_argument("--tokens", type=lambda t: tuple(_shape(x) for x in t.split(",")), default=None,
                   help="comma list of BATCHxSEQ (default "
                        + ",".join(f"{b}x{s}" for b, s in SHAPES) + "); with either option the "
                        "grid is the full product, with neither the sparse default: "
                        + ", ".join(f"{w}:{b}x{s}" for w, (b, s) in CELLS))
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of train,generate")
    p.add_argument("--skip", action="append", default=[],
                   help="skip contestants whose name contains this (repeatable), e.g. --skip inductor")
    p.add_argument("--new-tokens", type=int, default=8,
                   help="greedy tokens per generate call (default 8)")
    p.add_argument("--cell-seconds", type=float, default=3.0,
                   help="measuring budget per cell, all contestants together (default 3)")
    p.add_argument("--min-rounds", type=int, default=3, help="interleaved rounds per cell at least (default 3)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for the CPU contestants (default: torch's own choice)")
    p.add_argument("--profile-gemms", metavar="WIDTH:BATCHxSEQ", default=None,
                   help="instead of the sweep, time the training step's matmuls of one cell "
                        "in torch.mm vs XLA:CPU's dot (e.g. 512:16x256)")
    common.add_output_arguments(p, "PERFORMANCE.md and the plot")


def main(args) -> int:
    import torch_tpu  # noqa: F401  (registers the device)

    from torch_tpu import compile as tpu_compile

    tpu_compile.register()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile_gemms:
        width, shape = args.profile_gemms.split(":")
        print(profile_gemms(int(width), *_shape(shape)))
        return 0
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.perf_counter()
    names = [n for n in CONTESTANTS if not any(s.lower() in n.lower() for s in args.skip)]
    workloads = [w for w in args.workloads.split(",") if w]
    cells = grid(args.widths, args.tokens, args.quick)
    with common.progress(len(workloads) * len(cells) * (len(names) + 1), "bench scaling") as bar:
        bar.unit = "step"
        results = run(cells, workloads, names, args.new_tokens, args.cell_seconds,
                      args.min_rounds, bar)
    load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = scaling_report.render(results, names, args, SAMPLE_S, time.perf_counter() - t0,
                                 load_before, load_after)
    print(text)
    if not args.no_write:
        common.publish(args.out, "scaling", "Scaling: Llama train and generate across widths and "
                       "tokens per call", text + "\n\n" + common.notes(args.out, "scaling"),
                       {"bench_scaling.png": lambda path: scaling_report.plot(results, names, path)})
    return 0
