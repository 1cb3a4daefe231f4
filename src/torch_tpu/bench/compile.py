"""`python -m torch_tpu bench compile`: small models, compiled and eager, side by side.

Two models (`--model`): the small HF Llama (bench/llama.py) and a nanoGPT-style GPT-2
(bench/gpt.py: `nn.Linear` attention into SDPA, GELU MLP, LayerNorm, tied embeddings,
AdamW with weight-decay groups). Contestants, each running the same model (same initial
weights, same batches) in one process, interleaved round by round so machine noise falls
on all alike:
  - tpu compiled:  `torch.compile(model, backend="tpu")`, and the AdamW step compiled too
                   (`torch.compile(opt.step, backend="tpu")`);
  - tpu Strict / tpu DeferAndFuse: the eager modes;
  - CPU eager:     PyTorch's own CPU kernels;
  - CPU inductor:  `torch.compile(model)` (inductor) on CPU, its optimizer step compiled too;
  - jax.jit:       a hand-written JAX version of the same model and step (AdamW with the
                   torch optimizer's parameter groups), one jitted program with donated
                   buffers: the limit for any backend that runs on XLA.
Two workloads: a training step (forward, backward, AdamW) and inference (the forward
pass under no_grad). Reported: the median time per step, ratios against CPU eager and
against jax.jit, the first step (compile included, cold: no persistent cache) and its
ratio to jax.jit's, each contestant's loss against CPU eager's at steps 1 and 3 (after two
AdamW updates), and for the training step of each model the host time per phase of a
compiled step beside the jax.jit one's.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import tempfile
import time
from collections.abc import Callable

import torch

from . import common, gpt, llama

TRAIN, INFER = "train", "infer"


@dataclasses.dataclass
class Result:
    ms: dict = dataclasses.field(default_factory=dict)        # name -> median ms per step
    first_s: dict = dataclasses.field(default_factory=dict)   # name -> first step seconds
    losses: dict = dataclasses.field(default_factory=dict)    # name -> (step 1, step 3) loss
    errors: dict = dataclasses.field(default_factory=dict)    # name -> one-line error
    phases: dict = dataclasses.field(default_factory=dict)    # name -> {phase: median ms}


# ---------------------------------------------------------------- the models
@dataclasses.dataclass(frozen=True)
class Model:
    """A benchmark model: how to build it, its batches (tuples of CPU tensors), optimizer,
    training loss and inference output, and its hand-written JAX twin: `jax(model)` ->
    (params keyed by `named_parameters()`, loss_fn(params, *batch), forward(params, x))."""
    name: str
    spec: object                                    # the default size
    describe: Callable[[object], str]
    build: Callable[[object], torch.nn.Module]
    batches: Callable[[object, int], list]
    optimizer: Callable[[torch.nn.Module, object], torch.optim.Optimizer]
    loss: Callable                                  # (forward callable, *batch) -> loss
    infer: Callable                                 # (forward callable, x) -> output
    jax: Callable


def _llama_batches(spec, n):
    return [(ids,) for ids in llama.make_batches(spec, n)]


LLAMA = Model(
    "small Llama", llama.LlamaSpec(),
    lambda s: (f"HF LlamaForCausalLM, hidden {s.hidden}, {s.layers} layers, {s.heads} heads, "
               f"vocab {s.vocab}, batch {s.batch} x seq {s.seq}, AdamW lr {s.lr}"),
    llama.build_model, _llama_batches, llama.make_optimizer,
    lambda f, ids: f(input_ids=ids, labels=ids).loss,
    lambda f, ids: f(input_ids=ids).logits,
    lambda model: jax_llama_math(model))
GPT = Model(
    "GPT", gpt.GPTSpec(),
    lambda s: (f"nanoGPT-style GPT-2, width {s.width}, {s.layers} layers, {s.heads} heads, "
               f"vocab {s.vocab}, tied embeddings, batch {s.batch} x block {s.block}, "
               f"AdamW lr {s.lr}, betas {s.betas}, weight decay {s.weight_decay} on matrices"),
    gpt.build_model, gpt.make_batches, gpt.make_optimizer,
    lambda f, x, y: f(x, y)[1],
    lambda f, x: f(x)[0],
    gpt.jax_gpt)
MODELS = {"llama": LLAMA, "gpt": GPT}


# ---------------------------------------------------------------- the hand-written JAX versions
def jax_llama_math(model):
    """(params, loss_fn(p, ids), forward(p, ids)) of a JAX Llama equal to HF's
    LlamaForCausalLM with the weights of `model` (fp32)."""
    import jax
    import jax.numpy as jnp

    cfg = model.config
    hidden, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = hidden // nh
    eps = cfg.rms_norm_eps
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    params = {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.named_parameters()}

    def rms(x, w):
        return w * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps))

    def rotate(x):
        return jnp.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)

    def forward(p, ids):
        b, s = ids.shape
        inv = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
        freqs = jnp.arange(s, dtype=jnp.float32)[:, None] * inv[None]
        emb = jnp.concatenate([freqs, freqs], -1)
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        causal = jnp.tril(jnp.ones((s, s), bool))
        x = p["model.embed_tokens.weight"][ids]
        for i in range(cfg.num_hidden_layers):
            pre = f"model.layers.{i}."
            h = rms(x, p[pre + "input_layernorm.weight"])

            def heads(name, h=h, pre=pre):
                return (h @ p[pre + f"self_attn.{name}.weight"].T).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)

            q, k, v = heads("q_proj"), heads("k_proj"), heads("v_proj")
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
            scores = jnp.where(causal, q @ k.swapaxes(-1, -2) / math.sqrt(hd), -jnp.inf)
            attn = jax.nn.softmax(scores, -1) @ v
            x = x + attn.transpose(0, 2, 1, 3).reshape(b, s, hidden) @ p[pre + "self_attn.o_proj.weight"].T
            h = rms(x, p[pre + "post_attention_layernorm.weight"])
            gate = jax.nn.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
        return rms(x, p["model.norm.weight"]) @ p["lm_head.weight"].T

    def loss_fn(p, ids):
        logp = jax.nn.log_softmax(forward(p, ids)[:, :-1], -1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1))

    return params, loss_fn, forward


def jax_adamw_step(loss_fn, model, opt):
    """train_step(p, m, v, t, *batch) -> (p, m, v, t, loss): `jax.value_and_grad(loss_fn)`
    and torch.optim.AdamW's update, each parameter with its group's lr, betas, eps and
    weight decay in `opt` (an optimizer over `model`'s parameters)."""
    import jax
    import jax.numpy as jnp

    group = {id(q): g for g in opt.param_groups for q in g["params"]}
    hyper = {name: group[id(q)] for name, q in model.named_parameters()}

    def train_step(p, m, v, t, *batch):
        loss, g = jax.value_and_grad(loss_fn)(p, *batch)
        t = t + 1
        p2, m2, v2 = {}, {}, {}
        for k in p:
            h = hyper[k]
            lr, (b1, b2), eps, wd = h["lr"], h["betas"], h["eps"], h["weight_decay"]
            m2[k] = b1 * m[k] + (1 - b1) * g[k]
            v2[k] = b2 * v[k] + (1 - b2) * g[k] * g[k]
            denom = jnp.sqrt(v2[k]) / jnp.sqrt(1 - b2 ** t) + eps
            p2[k] = p[k] * (1 - lr * wd) - (lr / (1 - b1 ** t)) * m2[k] / denom
        return p2, m2, v2, t, loss

    return train_step


def jax_llama(model, spec):
    """(params, train_step, forward) of the JAX Llama, jitted, AdamW as
    llama.make_optimizer's (training buffers donated)."""
    import jax

    params, loss_fn, forward = jax_llama_math(model)
    step = jax_adamw_step(loss_fn, model, llama.make_optimizer(model, spec))
    return params, jax.jit(step, donate_argnums=(0, 1, 2)), jax.jit(forward)


def _nomark(name):
    pass


class JaxRunner:
    """The hand-written JAX version behind the same step() interface as the torch ones."""

    def __init__(self, base, spec, model: Model = LLAMA):
        import jax
        import jax.numpy as jnp

        self.jax = jax
        self.params, loss_fn, forward = model.jax(base)
        # the optimizer only lends its parameter groups to the JAX AdamW
        step = jax_adamw_step(loss_fn, base, model.optimizer(base, spec))
        self.train = jax.jit(step, donate_argnums=(0, 1, 2))
        self.fwd = jax.jit(forward)
        self.m = jax.tree.map(jnp.zeros_like, self.params)
        self.v = jax.tree.map(jnp.zeros_like, self.params)
        self.t = jnp.zeros((), jnp.float32)
        self.last = None

    def step(self, batch, workload, mark=_nomark):
        batch = (batch,) if isinstance(batch, torch.Tensor) else batch
        batch = [self.jax.device_put(b.numpy()) for b in batch]
        mark("upload")
        if workload == TRAIN:
            self.params, self.m, self.v, self.t, loss = self.train(self.params, self.m, self.v,
                                                                   self.t, *batch)
            self.last = loss
            mark("step")
        else:
            self.last = self.fwd(self.params, batch[0])
            mark("forward")
        return self.last

    def sync(self):
        if self.last is not None:
            self.last.block_until_ready()


# ---------------------------------------------------------------- torch contestants
class TorchRunner:
    def __init__(self, base, spec, device, workload, compile_backend=None, mode=None,
                 model: Model = LLAMA):
        self.device = device
        self.mode = mode
        self.bench_model = model
        # the last output stays alive until the next step: torch.tpu.synchronize() waits
        # for the live buffers, so work whose results were all dropped is not waited for
        self.last = None
        self.model = llama.replicate(base, device)
        if workload == INFER:
            self.model.eval()
        self.opt = model.optimizer(self.model, spec) if workload == TRAIN else None
        self.fwd = self.model
        self.opt_step = self.opt.step if self.opt is not None else None
        if compile_backend is not None:
            self.fwd = torch.compile(self.model, backend=compile_backend)
            if self.opt is not None:
                self.opt_step = torch.compile(self.opt.step, backend=compile_backend)

    def _context(self):
        if self.mode is None:
            return contextlib.nullcontext()
        import torch_tpu

        return torch_tpu.eager_mode(self.mode)

    def step(self, batch, workload, mark=_nomark):
        """One step; `mark(phase)` is called as each phase's host work ends."""
        batch = (batch,) if isinstance(batch, torch.Tensor) else batch
        with self._context():
            batch = [b.to(self.device) for b in batch]
            mark("upload")
            if workload == TRAIN:
                loss = self.bench_model.loss(self.fwd, *batch)
                mark("forward")
                loss.backward()
                mark("backward")
                self.opt_step()
                mark("opt.step")
                self.opt.zero_grad(set_to_none=True)
                mark("zero_grad")
                self.last = loss.detach()
                return self.last
            with torch.no_grad():
                self.last = self.bench_model.infer(self.fwd, batch[0])
            mark("forward")
            return self.last

    def sync(self):
        with self._context():
            common.sync(self.device)


def contestants(base, spec, workload, skip, model: Model = LLAMA):
    """name -> a zero-argument factory of a runner (built lazily: a failing one is
    reported, not fatal)."""
    import torch_tpu

    def tpu(**kw):
        return lambda: TorchRunner(base, spec, "tpu", workload, model=model, **kw)

    out = {"tpu compiled": tpu(compile_backend="tpu"), "tpu Strict": tpu(mode="strict")}
    if "DEFER_AND_FUSE" in torch_tpu.EagerMode.__members__:
        out["tpu DeferAndFuse"] = tpu(mode="defer_and_fuse")
    out["CPU eager"] = lambda: TorchRunner(base, spec, "cpu", workload, model=model)
    out["CPU inductor"] = lambda: TorchRunner(base, spec, "cpu", workload,
                                              compile_backend="inductor", model=model)
    out["jax.jit"] = lambda: JaxRunner(base, spec, model)
    return {k: v for k, v in out.items() if not any(s.lower() in k.lower() for s in skip)}


def _value(out) -> float:
    """A scalar of a step's output on the host (the loss, or the mean of the logits)."""
    import numpy as np

    if isinstance(out, torch.Tensor):
        return out.detach().float().mean().cpu().item()
    return float(np.asarray(out, dtype=np.float64).mean())


PROFILED = ("tpu compiled", "jax.jit")


def phases(runner, batches, n, synced=False) -> dict:
    """Median ms per phase of a training step over `n` steps, with the programs run and
    the Strict ops dispatched per step. Unsynced, a phase is its host work (Python,
    dispatch, and whatever a dispatch waits for itself) and "wait" the final sync; synced,
    each phase ends with a sync, so it holds its device work too."""
    from .. import metrics

    samples: dict = {}
    before = metrics.counters.copy()
    for ids in batches[:n]:
        runner.sync()
        time.sleep(1e-3)
        stamps = [("start", time.perf_counter())]

        def mark(name, at=stamps):
            if synced:
                runner.sync()
            at.append((name, time.perf_counter()))

        runner.step(ids, TRAIN, mark)
        runner.sync()
        stamps.append(("wait", time.perf_counter()))
        for (_, t0), (name, t1) in itertools.pairwise(stamps):
            samples.setdefault(name, []).append((t1 - t0) * 1e3)
        samples.setdefault("total", []).append((stamps[-1][1] - stamps[0][1]) * 1e3)
    out = {k: common.median(v) for k, v in samples.items()}
    if isinstance(runner, TorchRunner):
        grew = metrics.counters - before
        out["programs/step"] = grew["compile.calls"] / n
        out["Strict ops/step"] = grew["dispatches.strict"] / n
    return out


def bench(workload, rounds, skip, progress, model: Model = LLAMA) -> Result:
    spec = model.spec
    base = model.build(spec)
    batches = model.batches(spec, rounds + 4)
    res = Result()
    runners = {}
    for name, make in contestants(base, spec, workload, skip, model).items():
        try:
            torch.manual_seed(0)
            r = make()
            t0 = time.perf_counter()
            first = r.step(batches[0], workload)
            r.sync()
            res.first_s[name] = time.perf_counter() - t0
            r.step(batches[1], workload)  # steady state: optimizer state exists, recompiles done
            third = r.step(batches[2], workload)
            res.losses[name] = (_value(first), _value(third))
            runners[name] = r
        except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
            res.errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]

    def timer(r):
        it = iter(batches[3:] * 1000)

        def one():
            ids = next(it)
            r.sync()
            time.sleep(1e-3)  # let the previous contestant's thread pools go quiet
            t0 = time.perf_counter()
            r.step(ids, workload)
            r.sync()
            return time.perf_counter() - t0

        return one

    samples = common.interleaved({n: timer(r) for n, r in runners.items()}, rounds, progress)
    res.ms = {n: common.median(v) * 1e3 for n, v in samples.items()}
    if workload == TRAIN:
        for name in PROFILED:
            if name in runners:
                n = min(rounds, 30)
                res.phases[name] = phases(runners[name], batches[3:], n)
                res.phases[name + ", synced"] = phases(runners[name], batches[3:], n, synced=True)
    return res


# ---------------------------------------------------------------- report
def _fmt(x, digits=2):
    return "n/a" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def _ratio(num, den, fmt="{:.2f}x"):
    return fmt.format(num / den) if num and den else "n/a"


def _rel_diff(res: Result, name: str) -> float | None:
    ref, got = res.losses.get("CPU eager"), res.losses.get(name)
    if ref is None or got is None:
        return None
    return max(abs(g - r) / max(abs(r), 1e-12) for g, r in zip(got, ref))


def table(results: dict) -> str:
    """One model's table: a row per contestant, a group of columns per workload."""
    names = []
    for r in results.values():
        names += [n for n in list(r.first_s) + list(r.errors) if n not in names]
    header = ["contestant"]
    for w in results:
        header += [f"{w} ms", f"{w} vs CPU eager", f"{w} vs jax.jit", f"{w} first step s",
                   f"{w} first step / jax.jit's", f"{w} vs CPU, rel diff"]
    rows = []
    for n in names:
        row = [n]
        for r in results.values():
            if n in r.errors:
                row += ["error", "—", "—", r.errors[n].replace("|", "\\|"), "—", "—"]
                continue
            ms, cpu, jit = r.ms.get(n), r.ms.get("CPU eager"), r.ms.get("jax.jit")
            rel = _rel_diff(r, n)
            row += [_fmt(ms), _ratio(cpu, ms), _ratio(jit, ms), _fmt(r.first_s.get(n), 1),
                    _ratio(r.first_s.get(n), r.first_s.get("jax.jit"), "{:.1f}x"),
                    "n/a" if rel is None else f"{rel:.0e}"]
        rows.append(row)
    return common.markdown_table(header, rows)


PHASES = ("upload", "forward", "backward", "opt.step", "zero_grad", "step", "wait", "total",
          "programs/step", "Strict ops/step")


def phase_table(res: Result) -> str:
    names = list(res.phases)
    keys = [k for k in PHASES if any(k in res.phases[n] for n in names)]
    rows = []
    for k in keys:
        digits = 1 if k.endswith("/step") else 2
        rows.append([k] + [_fmt(res.phases[n].get(k), digits) if k in res.phases[n] else "—"
                           for n in names])
    return common.markdown_table(["phase, ms"] + names, rows)


def targets(model: Model, results: dict) -> list[str]:
    out = []
    tr, inf = results.get(TRAIN), results.get(INFER)
    c = "tpu compiled"
    if tr is not None and c in tr.ms and "jax.jit" in tr.ms:
        ratio = tr.ms["jax.jit"] / tr.ms[c]
        out.append(f"- {model.name} training, compiled vs hand-written jax.jit: **{ratio:.2f}x** "
                   f"(target ≥ 0.9x: {'met' if ratio >= 0.9 else 'not met'})")
    if tr is not None and c in tr.ms and "CPU eager" in tr.ms:
        ratio = tr.ms["CPU eager"] / tr.ms[c]
        out.append(f"- {model.name} training, compiled vs native CPU eager: **{ratio:.2f}x** "
                   f"(target ≥ 1.1x: {'met' if ratio >= 1.1 else 'not met'})")
    if inf is not None and c in inf.ms and "jax.jit" in inf.ms:
        ratio = inf.ms["jax.jit"] / inf.ms[c]
        out.append(f"- {model.name} inference, compiled vs jax.jit: **{ratio:.2f}x** "
                   f"(target ≥ 1.0x: {'met' if ratio >= 1.0 else 'not met'})")
    if tr is not None and "jax.jit" in tr.first_s and c in tr.first_s:
        ratio = tr.first_s[c] / tr.first_s["jax.jit"]
        out.append(f"- {model.name} first training step, compiled vs jax.jit: **{ratio:.1f}x** as "
                   f"long ({tr.first_s[c]:.1f} s vs {tr.first_s['jax.jit']:.1f} s; target ≤ 3x: "
                   f"{'met' if ratio <= 3 else 'not met'})")
    if tr is not None and _rel_diff(tr, "jax.jit") is not None:
        rel = _rel_diff(tr, "jax.jit")
        out.append(f"- {model.name} parity of the hand-written JAX step: loss vs torch CPU eager at "
                   f"steps 1 and 3, rel diff {rel:.0e} (tolerance 1e-4: "
                   f"{'ok' if rel <= 1e-4 else 'MISMATCH'})")
    return out


def render(by_model: dict, rounds: int, load_start: str) -> str:
    lines = [
        (f"Median ms per step over {rounds} interleaved rounds (one step each, synchronized); "
        "*vs X* is X's time / this one's (higher is faster). The first step includes every "
        "compile, with no persistent cache (a fresh temporary TORCH_TPU_CACHE_DIR); *first "
        "step / jax.jit's* is its time over jax.jit's first step (lower is better). *vs CPU, "
        "rel diff* is the largest relative difference from CPU eager's loss (inference: the "
        "mean of the output) at steps 1 and 3. Training is forward + backward + AdamW, "
        "inference the forward pass under no_grad, fp32. *tpu compiled* compiles the model "
        "and `opt.step` with backend=\"tpu\" (dynamo then keeps the AdamW state on the "
        "device, `capturable=True`, as it does for CUDA); *CPU inductor* compiles both with "
        "inductor. Inference runs after training in the same process, so its first steps "
        "find the eager modes' per-op executables already built. "
        f"Load average at the start: {load_start}."),
        "",
        "![compiled vs eager vs jax.jit](bench_compile.png)",
        "",
    ]
    goals = []
    for key, results in by_model.items():
        model = MODELS[key]
        lines += [f"### {model.name}", "", model.describe(model.spec) + ".", "",
                  table(results), ""]
        tr = results.get(TRAIN)
        if tr is not None and tr.phases:
            lines += [("One training step phase by phase, median ms, with the programs run "
                       "and the Strict ops dispatched per step. Plain columns: nothing "
                       "synchronized in between, so a phase is its host work (Python, "
                       "dispatch, and what a dispatch waits for itself, such as buffers it "
                       "donates that a running program still reads) and *wait* the final "
                       "sync; *synced*: a sync after each phase, which then holds its device "
                       "work too:"), "", phase_table(tr), ""]
        goals += targets(model, results)
    if goals:
        lines += ["### Targets", ""] + goals + [""]
    lines += [NOTES]
    return "\n".join(lines)


NOTES = """### Reading these numbers

- **The GPT (2026-12-01, load 6.7 at the start, 8.6 at the end, on 2 cores).** Compiled
  training ran 0.82x jax.jit (56.0 vs 46.2 ms), inference 0.97x. At width 128 XLA:CPU's
  kernels are barely faster than torch's (jax.jit 1.11x CPU eager on one thread). Where
  the gap sits: in XLA dumps (`XLA_FLAGS=--xla_dump_to=DIR`), the forward and backward
  programs have 103 + 107 fusions and 13 + 28 dots. The hand-written step has 287 and 39
  for everything, AdamW included, so those two programs are the hand-written ones' size.
  The AdamW program is not. It has 224 kernels for 26 parameters (140 elementwise, 84
  scalar), because capturable AdamW keeps a step tensor per parameter and derives each
  bias correction from it. The hand-written AdamW shares one counter and fuses into the
  gradient program. Timed alone at this load (minimum of 25), compiled `opt.step` took
  4.5 ms. AdamW added 0.6 ms to jax's `value_and_grad` (38.9 vs 38.2 ms). Forward plus
  backward took 49.9 ms compiled against 38.2: the Python around the programs, their
  ~70 outputs, and 2 eager ops per step (backward()'s `ones_like` seed and the zero
  tangent of the logits; tests/test_bench_gpt.py counts them).
- **Inference before 2026-12-01 timed dispatch only.** `torch.tpu.synchronize()` waits
  for live buffers. A step whose output was dropped before the sync was not waited for.
  The runners now keep their last output.
- **Load.** At these loads, the first steps vary 1.5-2x between runs (compiled GPT:
  32 s, then 45 s, 10 minutes apart). Compare the ratios, not the absolute times.

- **Why compiled training trails the hand-written jax.jit.** Not the XLA programs: the
  compiled step's three programs (AOTAutograd's forward and backward graphs, the AdamW
  step) have the same FLOPs and bytes as the hand-written ones (XLA's cost analysis:
  forward 28.6 vs 28.3 MFLOP, backward 56.1 vs 56.2) and a similar kernel count, and
  timed alone they ran within the noise of the same model split the same way in JAX
  (`jax.vjp` forward, backward, AdamW: three programs, which ran as fast as the fused
  one). The difference is the Python around them. One step timed phase by phase
  (medians of 30, quiet machine, 6.3 ms in all): input upload 0.4 ms; forward 1.6 ms, of
  which 0.6 ms in torch_tpu's program call (0.23 ms of it the XLA dispatch) and the rest
  dynamo's guards, AOTAutograd's runtime wrapper and the HF output; backward 2.0 ms
  (program call 0.7 ms; the rest the autograd engine, AOTAutograd's backward wrapper and
  the zero tangents it makes for outputs without a gradient); the compiled AdamW step
  1.3 ms (program call 0.85 ms for ~105 inputs and ~80 rewritten buffers); zero_grad
  0.2 ms; the final wait 0.5-0.9 ms. The hand-written step is one call, ~1 ms of Python,
  then ~3.5 ms of compute. What was done about it: backward runs on the calling thread
  (the autograd engine's device thread cost ~1 ms per step in hand-offs), uploads go
  through a jitted identity (jax.device_put's Python path took 70-160 µs), zero and ones
  tensors are one constant each instead of zeros plus a fill, and result tensors come
  from one C++ call. Together these took the step from 0.36x to about 0.7x jax.jit.
  Later, a program call's argument scan and its write-back of mutated storages moved to
  C (csrc/scan.cpp `program_scan`, csrc/graph.cpp `replace_buffers`), and small
  constants (backward()'s ones, zero tangents) became shared cached buffers: the three
  program calls went from 0.61 / 0.77 / 1.15 ms to 0.39 / 0.43 / 0.63 ms (forward,
  backward, AdamW), of which jax's own dispatch of the ~190 input and ~150 output
  buffers is 0.18 / 0.15 / 0.31 ms. What is left is torch's: dynamo's guards,
  AOTAutograd's wrappers, the autograd engine and the optimizer's Python.
- **Attention.** `F.scaled_dot_product_attention` now reaches the graphs as one fused op
  each way (torch's "overrideable" SDPA backend, the lowering eager uses), not the math
  path's ~30 ops. A step timed alone after that change (medians of 60, 4.4 ms in all):
  upload 0.19 ms, forward 1.02, backward 0.86, AdamW 0.79, zero_grad 0.14, final wait
  1.06. jax's dispatch costs ~3 µs per output buffer on XLA:CPU (timed alone: a
  program with 30 inputs and 51 outputs takes 150-210 µs to launch on an idle device),
  so the three programs' ~150 outputs, which the single hand-written program does not
  have, are a fixed part of the gap.
- **Compile time.** Each contestant's cold first step, timed in a fresh process of its
  own (same model, same batch, fresh cache): jax.jit 2.1 s; `backend="tpu"` 8.2 s; and
  torch's own pipeline with no XLA at all, `torch.compile(backend="aot_eager")` on CPU
  tensors, 6.5 s. So torch's tracing alone (dynamo's bytecode tracing 2.8 s, AOTAutograd
  2.9 s for the model and `opt.step`: metadata 0.4 s, joint-graph tracing 0.6 s,
  partitioning and the rest) is already 3x jax.jit's whole first step, whose cold step is
  one trace and one compile: the 2x target is out of reach of any backend that sits
  behind dynamo and AOTAutograd. torch_tpu's share is the rest, ~1.7 s: XLA compiles of
  the three graphs (0.6, 0.6 and 0.4 s) and ~17 small executables for the eager ops
  around them (~0.3 s). Each graph is built at XLA:CPU's LLVM `-O1`
  (`xla_backend_optimization_level=1`, only on CPU), which ran as fast as the default
  (1.48 vs 1.50 ms for the forward graph) and compiles in about half the time. The
  persistent cache (TORCH_TPU_CACHE_DIR) removes the XLA part in later processes, not
  torch's tracing.
- **Cores.** XLA:CPU runs these small GEMMs on about one core. Only the LLVM
  optimization level was tried here (`-O1` to `-O3`: no difference in run time); other
  flags, layouts and thread settings remain unexplored.
- **The machine is shared.** Other jobs ran during these measurements (see the load
  average): interleaving keeps ratios fair, absolute times are noisy. On a loaded 2-core
  machine torch's two-thread CPU team can stall for tens of milliseconds per step; use
  `--threads 1` for a steadier CPU eager baseline (the thread count is in the line above).
"""


def chart(by_model: dict, path) -> None:
    groups, names = [], []
    for key, results in by_model.items():
        for w, r in results.items():
            groups.append(f"{MODELS[key].name} {w}")
            names += [n for n in r.ms if n not in names]
    series = {n: [r.ms.get(n, float("nan")) for results in by_model.values()
                  for r in results.values()] for n in names}
    common.bar_chart(path, "ms per step (median, lower is better)", groups, series, "ms per step")


# ---------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=20, help="interleaved steps per contestant (default 20)")
    p.add_argument("--model", choices=[*MODELS, "all"], default="all",
                   help="which model (default all: the small Llama, then the GPT)")
    p.add_argument("--skip", action="append", default=[],
                   help="skip contestants whose name contains this (repeatable), e.g. --skip inductor")
    p.add_argument("--workload", choices=[TRAIN, INFER, "both"], default="both")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for the CPU contestants (default: torch's own choice)")
    p.add_argument("--no-write", action="store_true",
                   help="print only; leave docs/PERFORMANCE.md and the chart alone")


def main(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from .. import _cache
    from .. import compile as tpu_compile

    tpu_compile.register()
    load_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())

    # cold first steps: a fresh, empty persistent cache for this run, and none of
    # inductor's on-disk caches (FX graph, AOTAutograd), which outlive processes
    tmp = tempfile.TemporaryDirectory(prefix="torch_tpu_bench_cache_")
    _cache.setup(tmp.name)
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True
    workloads = [TRAIN, INFER] if args.workload == "both" else [args.workload]
    keys = list(MODELS) if args.model == "all" else [args.model]
    by_model = {}
    with common.progress(args.rounds * len(workloads) * len(keys), "bench compile") as bar:
        for key in keys:
            by_model[key] = {w: bench(w, args.rounds, args.skip, bar, MODELS[key]) for w in workloads}
    text = render(by_model, args.rounds, load_start)
    print(text)
    if not args.no_write:
        chart(by_model, common.DOCS / "bench_compile.png")
        common.write_section("compile", "torch.compile(backend=\"tpu\") vs eager vs jax.jit: "
                             + " and ".join(MODELS[k].name for k in keys), text)
        print(f"\nwrote {common.PERFORMANCE_MD.relative_to(common.REPO)} and docs/bench_compile.png")
    tmp.cleanup()
    return 0
