"""`python -m torch_tpu bench shapes`: what work whose shapes vary costs on tpu (issue 15).

Three modes: Strict, DeferAndFuse, and the compiled path (generation: HF's static cache,
`cache_implementation="static"`, which transformers compiles with the `tpu` backend;
training and the LM loop: `torch.compile(model, backend="tpu")` in Strict). Each mode runs
in its own fresh process with an empty persistent compile cache, so "cold" means cold, and
with a CPU eager replica of the same weights beside it; warm calls of the two alternate
(common.interleaved). Cases:

  generate   greedy HF `generate()` of the tiny Llama, batch 1, an 8-token prompt, at each
             `--lengths` in increasing order in one process. A call at a length reruns every
             shorter context, so the programs held after it are what a fresh process would
             compile for that length. A mode's first calls share `--gen-budget` seconds
             (HF's `max_time`): a call cut by it reports the tokens it reached, and the
             longer lengths are not run.
  train      variable-length training: `--train-steps` steps (AdamW, `loss.item()` each
             step) on batches whose lengths are drawn from 16..512, padded on the host to
             their bucket on tpu (`torch_tpu.pad_to_bucket`), exact on CPU; the first pass
             meets each length for the first time (cold), the second repeats the batches.
  lm loop    the word-language-model loop of tests/user_code/lm_bptt.py: batches are slices
             `source[i:i + bptt]` of one tensor at a new offset each step.
  cold 32    a 32-token generate in a fresh process with an empty compile cache, then in
             another fresh process with that cache on disk (the issue's targets: <= 3 s and
             <= 1 s), per mode.

Programs compiled = XLA compiles + persistent-cache (disk) hits over all kinds of program
(torch.tpu.compile_cache_stats()), fused graphs from torch_tpu.metrics.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import math
import os
import random
import sys
import tempfile
import time

import torch

from ..workloads import clients, decoder, wordlm
from ..workloads.decoder import DecoderSpec
from . import common, shapes_clients

MODES = ("strict", "defer_and_fuse", "compiled")
LABELS = {"strict": "Strict", "defer_and_fuse": "DeferAndFuse",
          "compiled": "compiled (static cache / torch.compile)"}
SPEC = DecoderSpec(hidden=48, layers=3, heads=4, kv_heads=2, vocab=256, seq=512, batch=2,
                   prompt=8, new_tokens=256, gen_batch=1, pad=0)
QUICK_SPEC = DecoderSpec(hidden=16, layers=1, heads=2, kv_heads=1, vocab=64, seq=24, batch=2,
                         prompt=4, new_tokens=4, gen_batch=1, pad=0)
CHART = "bench_shapes.png"
TARGET_COLD_S, TARGET_COLD_DISK_S = 3.0, 1.0


# ---------------------------------------------------------------- counting
def _fused() -> int:
    from torch_tpu import metrics

    return metrics.counters.get("fused_graphs_compiled", 0)


def _mode_ctx(mode: str):
    return common.eager("strict" if mode == "compiled" else mode)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------- generate
def gen_case(mode: str, spec: DecoderSpec, lengths, budget: float, rounds: int) -> list[dict]:
    """One row per length: programs held after its first call, that call's seconds, warm
    tokens/s against CPU eager's, and the greedy tokens' agreement with CPU's."""
    base = decoder.build_model(spec).eval()
    with _mode_ctx(mode):
        model = copy.deepcopy(base).to("tpu")
    prompt = decoder.prompt_ids(spec)
    kw = {"cache_implementation": "static"} if mode == "compiled" else {}
    rows, spent = [], 0.0

    def tpu_call(n, max_time=1e9):
        # every call passes max_time: its stopping criterion is an op of the decode step,
        # so warm calls without it would run (and compile) other programs than the first
        with _mode_ctx(mode), torch.no_grad():
            return model.generate(prompt.to("tpu"), max_new_tokens=n, do_sample=False,
                                  pad_token_id=0, max_time=max_time, **kw).cpu()

    def cpu_call(n):
        with torch.no_grad():
            return base.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0)

    for n in sorted(lengths, reverse=True):  # the longest first: shorter ones reuse its bucket
        row = {"case": "generate", "length": n, "unit": "tokens/s"}
        rows.append(row)
        if spent >= budget:
            row["error"] = f"not run: the {budget:.0f} s budget of first calls was spent"
            continue
        p0, g0 = common.programs(), _fused()
        try:
            row["cold_s"], out = _timed(functools.partial(tpu_call, n, budget - spent))
        except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
            row["error"] = common.one_line(e)
            break
        spent += row["cold_s"]
        held = common.programs()
        row.update(programs=held, new_programs=held - p0, fused=_fused(),
                   new_fused=_fused() - g0, done=out.shape[1] - prompt.shape[1])
        row["cpu_cold_s"], ref = _timed(functools.partial(cpu_call, n))
        if row["done"] < n:  # cut by the budget: no warm figure at this length
            row["error"] = (f"first call cut by the budget after {row['done']}/{n} tokens, "
                            f"{row['cold_s']:.0f} s")
            spent = budget
            continue
        row["agree"] = bool(torch.equal(out, ref))
        p1 = common.programs()
        samples = common.interleaved(
            {d: functools.partial(lambda f: _timed(f)[0], functools.partial(call, n))
             for d, call in (("tpu", tpu_call), ("cpu", cpu_call))}, rounds)
        row["warm_programs"] = common.programs() - p1
        row["warm"] = n / common.median(samples["tpu"])
        row["cpu_warm"] = n / common.median(samples["cpu"])
    return rows


# ---------------------------------------------------------------- variable-length training
def train_lengths(steps: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(steps)]


def train_case(mode: str, spec: DecoderSpec, lengths, warm_passes: int = 1) -> dict:
    """Pass 1 over batches of `lengths` (each length new: cold), then `warm_passes` more
    passes over the same batches, alternating step by step with CPU eager."""
    base = decoder.build_model(spec).train()
    batches = decoder.random_batches(spec, lengths)
    with _mode_ctx(mode):
        tpu = copy.deepcopy(base).to("tpu")
    cpu = copy.deepcopy(base)
    opts = {d: decoder.make_optimizer(m, spec) for d, m in (("tpu", tpu), ("cpu", cpu))}
    fwd = {"tpu": torch.compile(tpu, backend="tpu") if mode == "compiled" else tpu, "cpu": cpu}
    losses = {"tpu": [], "cpu": []}
    index = {"tpu": 0, "cpu": 0}

    def step(d):
        ids = batches[index[d] % len(batches)]
        index[d] += 1
        t0 = time.perf_counter()
        batch = {"input_ids": ids, "labels": ids}
        if d == "tpu":  # padded on the host to the bucket; CPU trains on the exact length
            import torch_tpu

            batch = torch_tpu.pad_to_bucket(batch)
        with _mode_ctx(mode) if d == "tpu" else contextlib.nullcontext():
            loss = fwd[d](**{k: v.to(d) for k, v in batch.items()}).loss
            loss.backward()
            opts[d].step()
            opts[d].zero_grad(set_to_none=True)
            losses[d].append(loss.item())
        return time.perf_counter() - t0

    row = {"case": "train", "length": f"{len(lengths)} steps, lengths {min(lengths)}-{max(lengths)}",
           "unit": "tokens/s", "lengths": list(lengths)}
    p0, g0 = common.programs(), _fused()
    row["cold_s"] = sum(step("tpu") for _ in lengths)
    row.update(programs=common.programs() - p0, fused=_fused() - g0)
    row["cpu_cold_s"] = sum(step("cpu") for _ in lengths)
    p1 = common.programs()
    samples = common.interleaved({"tpu": lambda: step("tpu"), "cpu": lambda: step("cpu")},
                                 len(lengths) * warm_passes)
    row["warm_programs"] = common.programs() - p1
    tokens = spec.batch * sum(lengths) * warm_passes
    row["warm"] = tokens / sum(samples["tpu"])
    row["cpu_warm"] = tokens / sum(samples["cpu"])
    a, b = torch.tensor(losses["tpu"]), torch.tensor(losses["cpu"])
    row["loss_rel_diff"] = float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())
    row["agree"] = row["loss_rel_diff"] < 1e-3
    return row


# ---------------------------------------------------------------- the sliced-batch LM loop
def lm_loop_case(mode: str, batches: int) -> dict:
    """word_language_model's batching: `source[i:i + bptt]` of one batchified stream. The
    first two batches run alone (DeferAndFuse's first graph lacks the optimizer step that
    every later one begins with); the rest alternate with CPU eager."""
    import torch.nn.functional as F

    cols, base = wordlm.build(batches)
    with _mode_ctx(mode):
        src = {"tpu": cols.to("tpu"), "cpu": cols}
        models = {"tpu": copy.deepcopy(base).to("tpu"), "cpu": copy.deepcopy(base)}
    run = {"tpu": torch.compile(models["tpu"], backend="tpu") if mode == "compiled"
           else models["tpu"], "cpu": models["cpu"]}
    opts = {d: torch.optim.SGD(m.parameters(), lr=0.5) for d, m in models.items()}
    index, losses = {"tpu": 0, "cpu": 0}, {"tpu": [], "cpu": []}

    def step(d):
        i = index[d] * wordlm.BPTT
        index[d] += 1
        t0 = time.perf_counter()
        with _mode_ctx(mode) if d == "tpu" else contextlib.nullcontext():
            data, targets = src[d][i:i + wordlm.BPTT], src[d][i + 1:i + 1 + wordlm.BPTT].reshape(-1)
            opts[d].zero_grad()
            loss = F.cross_entropy(run[d](data).view(-1, wordlm.VOCAB), targets)
            loss.backward()
            opts[d].step()
            losses[d].append(loss.item())
        return time.perf_counter() - t0

    row = {"case": "lm loop", "length": f"{batches} batches of source[i:i+{wordlm.BPTT}]",
           "unit": "steps/s"}
    p0, g0 = common.programs(), _fused()
    row["cold_s"] = step("tpu")
    step("tpu")
    row.update(programs=common.programs() - p0, fused=_fused() - g0)
    row["cpu_cold_s"] = step("cpu")
    step("cpu")
    p1 = common.programs()
    samples = common.interleaved({"tpu": lambda: step("tpu"), "cpu": lambda: step("cpu")},
                                 batches - 2)
    row["warm_programs"] = common.programs() - p1
    row["warm"] = 1 / common.median(samples["tpu"])
    row["cpu_warm"] = 1 / common.median(samples["cpu"])
    a, b = torch.tensor(losses["tpu"]), torch.tensor(losses["cpu"])
    row["agree"] = bool(torch.allclose(a, b, rtol=1e-3, atol=1e-4))
    return row


# ---------------------------------------------------------------- children
def child(mode: str, args) -> dict:
    """Every in-process case of one mode (run by `main` in a fresh process)."""
    import torch_tpu  # noqa: F401  (registers the device)

    spec, lengths = _spec(args), _lengths(args)
    rows = gen_case(mode, spec, lengths, args.gen_budget, args.warm_rounds)
    for name, fn in (("train", lambda: train_case(mode, spec, train_lengths(
                          args.train_steps, *_train_range(args)))),
                     ("lm loop", lambda: lm_loop_case(mode, args.lm_batches))):
        try:
            rows.append(fn())
        except Exception as e:  # noqa: BLE001  (reported in the table, not hidden)
            rows.append({"case": name, "error": common.one_line(e)})
    for r in rows:
        r["mode"] = mode
    return {"rows": rows}


def cold_child(mode: str, tokens: int, budget: float, args) -> dict:
    """One `tokens`-token generate as the first work of this process (run by `main`)."""
    t0 = time.perf_counter()
    import torch_tpu  # noqa: F401

    spec = _spec(args)
    model = decoder.build_model(spec).eval()
    with _mode_ctx(mode):
        model = model.to("tpu")
    prompt = decoder.prompt_ids(spec)
    kw = {"cache_implementation": "static"} if mode == "compiled" else {}
    start_s = time.perf_counter() - t0
    with _mode_ctx(mode), torch.no_grad():
        first_s, out = _timed(lambda: model.generate(
            prompt.to("tpu"), max_new_tokens=tokens, do_sample=False, pad_token_id=0,
            max_time=budget, **kw).cpu())
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"].values()
    return {"mode": mode, "first_s": first_s, "start_s": start_s, "tokens": tokens,
            "done": out.shape[1] - prompt.shape[1], "programs": common.programs(),
            "disk_hits": sum(k["disk_hits"] for k in kinds),
            "xla_compiles": sum(k["xla_compiles"] for k in kinds)}


def _spawn(argv: list[str], cache_dir: str, timeout: float) -> dict:
    return common.run_child([sys.executable, "-m", "torch_tpu", "bench", "shapes", *argv],
                            dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir), timeout)


def _child_argv(args) -> list[str]:
    argv = ["--lengths", args.lengths, "--gen-budget", str(args.gen_budget),
            "--warm-rounds", str(args.warm_rounds), "--train-steps", str(args.train_steps),
            "--train-range", args.train_range, "--lm-batches", str(args.lm_batches)]
    return argv + (["--quick"] if args.quick else [])


# ---------------------------------------------------------------- report
def _f(x, fmt="{:.2f}"):
    return "—" if x is None or math.isnan(x) else fmt.format(x)


def _ratio(a, b):
    return a / b if a and b and not (math.isnan(a) or math.isnan(b)) else float("nan")


def render(rows: list[dict], cold: list[dict], spec: DecoderSpec, args, seconds: float) -> str:
    table = []
    for r in rows:
        if "cold_s" not in r:
            table.append([r["case"], r.get("length", "—"), LABELS[r["mode"]]]
                         + ["—"] * 8 + [r.get("error", "")])
            continue
        progs = f"{r.get('new_programs', r['programs'])} ({r.get('new_fused', r['fused'])})"
        warm = r.get("warm")
        table.append([r["case"], r["length"], LABELS[r["mode"]], progs,
                      r.get("warm_programs", "—"), _f(r["cold_s"]), _f(r["cpu_cold_s"], "{:.3f}"),
                      _f(warm, "{:.1f}"), _f(r.get("cpu_warm"), "{:.1f}"),
                      _f(_ratio(warm, r.get("cpu_warm")), "{:.2f}x"),
                      {True: "yes", False: "**no**"}.get(r.get("agree"), "—"),
                      r.get("error", "")])
    head = ["case", "size", "mode", "programs (fused graphs)", "programs once warm",
            "cold s", "CPU eager cold s", "warm tpu /s", "CPU eager /s", "tpu / CPU",
            "same result as CPU", "note"]
    cold_rows = [[LABELS[c["mode"]], c["cache"], f"{c.get('done', '—')}/{c.get('tokens', '—')}",
                  _f(c.get("first_s")), _f(c.get("target")),
                  _f(_ratio(c.get("first_s"), c.get("target")), "{:.1f}x"),
                  c.get("xla_compiles", "—"), c.get("disk_hits", "—"), _f(c.get("start_s"), "{:.1f}"),
                  c.get("error", "")] for c in cold]
    cold_head = ["mode", "compile cache", "tokens", "first call s", "target s",
                 "first call / target", "XLA compiles", "disk hits", "process start s", "note"]
    lo, hi = _train_range(args)
    text = (
        f"Tiny Llama: {spec.describe()}. Every mode runs in its own fresh process with an "
        f"empty persistent compile cache, beside a CPU eager replica of the same weights; "
        f"warm calls of the two alternate. Generation lengths {args.lengths} run longest "
        f"first in one process: the longest call's programs are what a fresh process "
        f"compiles for it, and the shorter calls run in its bucket (HF generate on tpu "
        f"decodes at a bucketed capacity: docs/DYNAMIC_SHAPES.md); programs = those the "
        f"call compiled, cold s its first call; the first calls of a mode share a "
        f"{args.gen_budget:.0f} s budget (HF's `max_time`). "
        f"Training: {args.train_steps} AdamW steps, lengths drawn from {lo}..{hi} "
        f"(seed 0), batch {spec.batch}; cold s is the first pass (each length new), warm the "
        f"second pass over the same batches, throughput in tokens/s. LM loop: "
        f"{args.lm_batches} batches `source[i:i+{wordlm.BPTT}]`, batch {wordlm.BATCH}, vocab "
        f"{wordlm.VOCAB} (tests/user_code/lm_bptt.py's model); cold s is the first batch, "
        f"programs are those of the first two batches (DeferAndFuse's first graph lacks the "
        f"optimizer step). Compiled path: generation with `cache_implementation=\"static\"` "
        f"(transformers compiles the decode step with the `tpu` backend), training and the "
        f"LM loop under `torch.compile(backend=\"tpu\")`; CPU eager is plain eager with the "
        f"default cache. Programs = XLA compiles + disk-cache hits over all kinds "
        f"(`torch.tpu.compile_cache_stats()`), fused graphs from `torch_tpu.metrics`. The "
        f"whole run took {seconds / 60:.1f} min.\n\n"
        + common.markdown_table(head, table)
        + "\n\n### Cold 32-token generate, fresh process\n\n"
        f"Each row its own process: first with an empty compile cache, then a second process "
        f"with the cache the first one left on disk (generating the tokens the first one "
        f"reached). First call = the `generate()` call alone; process start = import, model "
        f"build and `.to(\"tpu\")`. Calls are cut at {args.cold_budget:.0f} s (`max_time`).\n\n"
        + common.markdown_table(cold_head, cold_rows)
        + "\n\n" + _targets(rows, cold)
        + f"\n\n![programs and warm throughput against generated length]({CHART})\n")
    return text


def _targets(rows: list[dict], cold: list[dict]) -> str:
    out = ["### Issue 15's targets, as measured in this run", ""]
    for c in cold:
        miss = "" if c.get("first_s", 1e9) <= c["target"] else " (missed)"
        out.append(f"- cold {c.get('tokens', '?')}-token generate, {LABELS[c['mode']]}, "
                   f"{c['cache']} cache: {_f(c.get('first_s'))} s vs <= {c['target']:.0f} s"
                   f"{miss}")
    for mode in MODES:
        gen = {r["length"]: r for r in rows if r["mode"] == mode and r["case"] == "generate"
               and "programs" in r}
        short = [c for c in cold if c["mode"] == mode and c["cache"] == "empty"
                 and c.get("xla_compiles") is not None]
        if gen and short:  # both from fresh processes: the longest call, the cold one
            b, c = max(gen), short[0]
            n_short = c["xla_compiles"] + c["disk_hits"]
            cut = "" if gen[b].get("done") == b else f" (the {b}-token call was cut at {gen[b]['done']})"
            out.append(f"- generate programs in a fresh process, {LABELS[mode]}: {b} tokens "
                       f"{gen[b]['programs']} vs {c['tokens']} tokens {n_short}: "
                       f"{gen[b]['programs'] / n_short:.1f}x (target <= 2x){cut}")
        later = [r["new_programs"] for n, r in gen.items() if n != max(gen)]
        if later:
            out.append(f"- generate programs after the {max(gen)}-token call, {LABELS[mode]}: "
                       f"{sum(later)} over the shorter lengths (target 0)")
        for n, r in sorted(gen.items()):
            if mode != "strict" and r.get("warm"):
                out.append(f"- warm generate {n} tokens, {LABELS[mode]}: "
                           f"{r['warm'] / r['cpu_warm']:.2f}x CPU eager (target >= 1.0x)")
    return "\n".join(out)


def chart(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in MODES:
        gen = sorted((r for r in rows if r["mode"] == mode and r["case"] == "generate"
                      and "programs" in r), key=lambda r: r["done"])
        if gen:
            a1.plot([r["done"] for r in gen], [r["programs"] for r in gen], "o-", label=LABELS[mode])
        warm = [r for r in gen if r.get("warm")]
        if warm:
            a2.plot([r["length"] for r in warm], [r["warm"] for r in warm], "o-", label=LABELS[mode])
    cpu = {}  # length -> CPU eager's figures, one per mode's process
    for r in rows:
        if r["case"] == "generate" and r.get("cpu_warm"):
            cpu.setdefault(r["length"], []).append(r["cpu_warm"])
    if cpu:
        xs = sorted(cpu)
        a2.plot(xs, [common.median(cpu[x]) for x in xs], "k--s", label="CPU eager (median)")
    for ax, title, ylabel in ((a1, "programs held (longest call first)", "programs"),
                              (a2, "warm generate throughput", "tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("new tokens generated")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- CLI
def _spec(args) -> DecoderSpec:
    return QUICK_SPEC if args.quick else SPEC


def _lengths(args) -> list[int]:
    return sorted(int(x) for x in args.lengths.split(",") if x)


def _train_range(args) -> tuple[int, int]:
    lo, hi = (int(x) for x in args.train_range.split(","))
    return lo, hi


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    p.add_argument("--lengths", default="16,64,256", help="new tokens per generate call")
    p.add_argument("--cold-tokens", type=int, default=32, help="tokens of the fresh-process generate")
    p.add_argument("--gen-budget", type=float, default=90.0,
                   help="seconds a mode's first generate calls may take in all (default 90)")
    p.add_argument("--cold-budget", type=float, default=60.0,
                   help="seconds a fresh process's generate may take (default 60)")
    p.add_argument("--warm-rounds", type=int, default=3, help="warm generate calls per length")
    p.add_argument("--train-steps", type=int, default=3,
                   help="variable-length training steps per pass (default 3)")
    p.add_argument("--train-range", default="16,512", help="lo,hi of the training lengths")
    p.add_argument("--lm-batches", type=int, default=12, help="batches of the sliced LM loop")
    p.add_argument("--quick", action="store_true",
                   help="a tiny model and tiny lengths (for tests); implies --no-write")
    p.add_argument("--clients", metavar="NAMES",
                   help="instead: real clients whose shapes vary, each in fresh processes "
                        "(comma list of " + ",".join(clients.NAMES) + ", or all)")
    p.add_argument("--client-timeout", type=float, default=300.0,
                   help="seconds one client's process may take (default 300)")
    common.add_output_arguments(p)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--cold-child", choices=MODES, help=argparse.SUPPRESS)


def main(args) -> int:
    if args.clients:
        return shapes_clients.main(args)
    if args.quick and not (args.child or args.cold_child):  # the parent passes them on
        args.lengths, args.cold_tokens, args.train_range = "2,3,4", 3, "8,24"
        args.train_steps, args.lm_batches, args.warm_rounds = 2, 4, 1
    if args.child:
        print(common.RESULT + json.dumps(child(args.child, args)))
        return 0
    if args.cold_child:
        print(common.RESULT + json.dumps(cold_child(args.cold_child, args.cold_tokens,
                                             args.cold_budget, args)))
        return 0
    t0 = time.perf_counter()
    modes = [m for m in args.modes.split(",") if m]
    rows, cold = [], []
    with tempfile.TemporaryDirectory(prefix="bench_shapes_") as tmp, \
            common.progress(3 * len(modes), "bench shapes") as bar:
        for mode in modes:
            bar.set_description(f"bench shapes: {mode}, in-process cases")
            res = _spawn(["--child", mode, *_child_argv(args)], os.path.join(tmp, mode),
                         timeout=3 * args.gen_budget + 900)
            rows.extend(res.get("rows") or [{"case": "all", "mode": mode, "error": res.get("error")}])
            bar.update(1)
        for mode in modes:
            folder, tokens = os.path.join(tmp, f"cold_{mode}"), args.cold_tokens
            for cache, target in (("empty", TARGET_COLD_S), ("warm disk", TARGET_COLD_DISK_S)):
                bar.set_description(f"bench shapes: {mode}, cold generate, {cache} cache")
                res = _spawn(["--cold-child", mode, "--cold-tokens", str(tokens),
                              "--cold-budget", str(args.cold_budget),
                              *(["--quick"] if args.quick else [])], folder,
                             timeout=args.cold_budget + 300)
                res.update(mode=mode, cache=cache, target=target)
                cold.append(res)
                tokens = res.get("done") or tokens  # the warm run repeats what was reached
                bar.update(1)
    text = render(rows, cold, _spec(args), args, time.perf_counter() - t0)
    print(text)
    if not (args.no_write or args.quick):
        common.publish(args.out, "shapes", "Shapes: generation, variable lengths and sliced "
                       "batches (tiny Llama)", text, {CHART: lambda path: chart(rows, path)})
    return 0
