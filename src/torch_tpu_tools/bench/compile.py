"""`python -m torch_tpu bench compile`: small models, compiled and eager, side by side.

Two models (`--model`): the small HF Llama (workloads/decoder.py) and a nanoGPT-style GPT-2
(workloads/gpt.py: `nn.Linear` attention into SDPA, GELU MLP, LayerNorm, tied embeddings,
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
import dataclasses
import itertools
import os
import subprocess
import sys
import tempfile
import time

import torch

from .. import workloads
from ..workloads import decoder
from ..workloads.models import LLAMA, MODELS, Model
from . import common
from .compile_report import INFER, TRAIN, chart, render


@dataclasses.dataclass
class Result:
    ms: dict = dataclasses.field(default_factory=dict)        # name -> median ms per step
    first_s: dict = dataclasses.field(default_factory=dict)   # name -> first step seconds
    losses: dict = dataclasses.field(default_factory=dict)    # name -> (step 1, step 3) loss
    errors: dict = dataclasses.field(default_factory=dict)    # name -> one-line error
    phases: dict = dataclasses.field(default_factory=dict)    # name -> {phase: median ms}
    cold: dict = dataclasses.field(default_factory=dict)      # name -> cold first step s


# ---------------------------------------------------------------- the hand-written JAX step
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
    decoder.make_optimizer's (training buffers donated)."""
    import jax

    params, loss_fn, forward, _ = decoder.jax_llama_math(model)
    step = jax_adamw_step(loss_fn, model, decoder.make_optimizer(model, spec))
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
        self.model = workloads.replicate(base, device)
        if workload == INFER:
            self.model.eval()
        self.opt = model.optimizer(self.model, spec) if workload == TRAIN else None
        self.fwd = self.model
        self.opt_step = self.opt.step if self.opt is not None else None
        if compile_backend is not None:
            self.fwd = torch.compile(self.model, backend=compile_backend)
            if self.opt is not None:
                self.opt_step = torch.compile(self.opt.step, backend=compile_backend)

    def step(self, batch, workload, mark=_nomark):
        """One step; `mark(phase)` is called as each phase's host work ends."""
        batch = (batch,) if isinstance(batch, torch.Tensor) else batch
        with common.eager(self.mode):
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
        with common.eager(self.mode):
            common.sync(self.device)


def contestants(base, spec, workload, skip, model: Model = LLAMA):
    """name -> a zero-argument factory of a runner (built lazily: a failing one is
    reported, not fatal)."""
    import torch_tpu

    def tpu(**kw):
        return lambda: TorchRunner(base, spec, "tpu", workload, model=model, **kw)

    out = {"tpu compiled": tpu(compile_backend="tpu"), "tpu Strict": tpu(mode="strict")}
    if "DEFER_AND_FUSE" in torch_tpu.EagerMode.__members__:  # +defer: one program per step
        out["tpu compiled+defer"] = tpu(compile_backend="tpu", mode="defer_and_fuse")
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
    from torch_tpu import metrics

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
            res.errors[name] = common.one_line(e, 120)

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


# ---------------------------------------------------------------- cold first steps
COLD = ("tpu compiled", "CPU aot_eager", "jax.jit")


def cold_first_steps(key: str, threads) -> dict:
    """name -> seconds of a first training step, each contestant in a fresh process of its
    own with empty caches, as a user's first run meets it (None: it failed). *CPU
    aot_eager* is torch's own tracing alone (dynamo and AOTAutograd, then torch's CPU
    kernels, no XLA): the floor of any backend behind torch.compile."""
    out = {}
    for name in COLD:
        with tempfile.TemporaryDirectory(prefix="torch_tpu_cold_") as tmp:
            code = f"from torch_tpu_tools.bench.compile import _cold; _cold({key!r}, {name!r}, {threads!r})"
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 env=dict(os.environ, TORCH_TPU_CACHE_DIR=tmp), timeout=1800)
            last = run.stdout.split()[-1:]
            out[name] = float(last[0]) if run.returncode == 0 and last else None
    return out


def _cold(key: str, name: str, threads) -> None:
    """In the fresh process: build `name`, time its first training step, print seconds."""
    if threads:
        torch.set_num_threads(threads)
    from torch_tpu import compile as tpu_compile

    tpu_compile.register()
    model = MODELS[key]
    base = model.build(model.spec)
    batch = model.batches(model.spec, 1)[0]
    torch.manual_seed(0)
    if name == "CPU aot_eager":
        r = TorchRunner(base, model.spec, "cpu", TRAIN, compile_backend="aot_eager", model=model)
    else:
        r = contestants(base, model.spec, TRAIN, [], model)[name]()
    t0 = time.perf_counter()
    r.step(batch, TRAIN)
    r.sync()
    print(time.perf_counter() - t0)


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
    p.add_argument("--no-cold", action="store_true",
                   help="leave out the cold first steps (fresh processes: compiled, aot_eager, jax.jit)")
    common.add_output_arguments(p)


def main(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    from torch_tpu import _cache
    from torch_tpu import compile as tpu_compile

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
            by_model[MODELS[key]] = {w: bench(w, args.rounds, args.skip, bar, MODELS[key])
                                     for w in workloads}
            if TRAIN in workloads and not args.no_cold:
                by_model[MODELS[key]][TRAIN].cold = cold_first_steps(key, args.threads)
    text = render(by_model, args.rounds, load_start, common.notes(args.out, "compile"))
    print(text)
    if not args.no_write:
        common.publish(args.out, "compile", "torch.compile(backend=\"tpu\") vs eager vs jax.jit: "
                       + " and ".join(MODELS[k].name for k in keys), text,
                       {"bench_compile.png": lambda path: chart(by_model, path)})
    tmp.cleanup()
    return 0
