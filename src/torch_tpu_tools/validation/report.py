"""The sweeps' results on disk and in docs, all under the output folder OUT (`--out`,
default ./docs): the JSON files OUT/validation/<kind>-<mode>.json (merged across chunked
runs), the markdown reports in OUT/VALIDATION.md and the coverage plot; and the generated
expected failures of the Strict sweeps, package data beside this module
(expected/ops.json, expected/models.json), which tests/tools/test_validation.py reads."""
from __future__ import annotations

import collections
import datetime
import json
import pathlib

from ..bench import common

# package data, found beside this module (not in a checkout): an installed copy has it too
EXPECTED = pathlib.Path(__file__).with_name("expected")

HEADER = """# Validation

What runs on the `tpu` device, measured by the sweeps themselves
(`python -m torch_tpu validate ops|models|variants`): PyTorch's OpInfo database, the
transformers model zoo and real-config variants of it, each on tpu against CPU eager. Each section names the commands that produced it.
Here "tpu" is the tpu device running on XLA:CPU. The raw results are in `validation/`.

![coverage](validation_coverage.png)
"""

OPS_TARGET, MODELS_TARGET, MODELS_CPU_TARGET = 0.95, 0.98, 400


def results_path(out: pathlib.Path, kind: str, mode: str) -> pathlib.Path:
    return out / "validation" / f"{kind}-{mode}.json"


def load(out: pathlib.Path, kind: str, mode: str) -> dict:
    p = results_path(out, kind, mode)
    if p.exists():
        return json.loads(p.read_text())
    return {"meta": {"runs": []}, "results": {}}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def save(out: pathlib.Path, kind: str, mode: str, data: dict) -> None:
    p = results_path(out, kind, mode)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(p)


def new_run() -> dict:
    return {"command": common.command_line(), "started": _now()}


def merge(out: pathlib.Path, kind: str, mode: str, updates: dict, run: dict) -> dict:
    """Fold this run's results into the stored ones, under a lock (chunks may run side by
    side): ops results merge per op and dtype, model results per type. Returns the merged
    data."""
    import fcntl

    path = results_path(out, kind, mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.stem}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(out, kind, mode)
        for name, r in updates.items():
            if kind != "models":  # ops: per op and dtype; conformance: per op and family
                data["results"].setdefault(name, {}).update(r)
            else:
                data["results"][name] = r
        if run not in data["meta"]["runs"]:
            data["meta"]["runs"].append(run)
        save(out, kind, mode, data)
    return data


# ---------------------------------------------------------------- ops
def ops_summary(results: dict, dtypes) -> dict:
    per = {d: collections.Counter() for d in dtypes}
    for by_dtype in results.values():
        for d, r in by_dtype.items():
            if d in per:
                per[d][r["status"]] += 1
    cpu = sum(c["pass"] + c["fail"] for c in per.values())
    ok = sum(c["pass"] for c in per.values())
    return {"per_dtype": per, "cpu_pairs": cpu, "tpu_pass": ok,
            "rate": ok / cpu if cpu else 0.0}


def missing_lowerings(results: dict) -> collections.Counter:
    """aten op -> number of (op, dtype) pairs whose first failure is its missing lowering."""
    c = collections.Counter()
    for by_dtype in results.values():
        for r in by_dtype.values():
            if r["status"] == "fail" and r.get("aten"):
                c[r["aten"]] += 1
    return c


def failure_kinds(results: dict) -> collections.Counter:
    return collections.Counter(r.get("kind", "?") for by in results.values()
                               for r in by.values() if r["status"] == "fail")


# Why the failures that remain after a sweep are left as they are (op_db name -> cause).
# The sweep's own detail says what differed; this says why it is not fixed.
CAUSES = {
    "chalf": "complex32 is not an XLA type; tpu refuses it with UnsupportedDtypeError",
    "grid_sampler_2d": "float32 rounding of gradient sums that cancel to ~0; as far from a "
                       "float64 reference as CPU's own result",
    "grid_sampler_3d": "float32 rounding of gradient sums that cancel to ~0; as far from a "
                       "float64 reference as CPU's own result",
    "linalg.householder_product": "badly conditioned sample: tpu's gradient is closer to a "
                                  "float64 reference than CPU's",
    "linalg.lstsq": "one gradient element 1e-5 over tolerance: float32 rounding (SVD-based "
                    "solve vs LAPACK's)",
    "linalg.lstsq.grad_oriented": "one gradient element 1e-5 over tolerance: float32 "
                                  "rounding (SVD-based solve vs LAPACK's)",
    "linalg.ldl_factor": "not lowered: LAPACK's Bunch-Kaufman pivot format",
    "linalg.ldl_factor_ex": "not lowered: LAPACK's Bunch-Kaufman pivot format",
    "linalg.ldl_solve": "not lowered: LAPACK's Bunch-Kaufman pivot format",
    "matrix_exp": "one element 5e-4 relative off: Pade (XLA) vs Taylor (torch) in float32",
    "msort": "ties in bfloat16 route the gradient to a different but equal element",
    "to": "the sample moves a tpu tensor to the CPU inside the graph; the harness's tpu-side "
          "cotangent is on the wrong device for that output",
    "to_sparse": "sparse layouts are not supported on tpu",
    "sparse.mm.reduce": "sparse layouts are not supported on tpu",
    "sparse.sampled_addmm": "sparse layouts are not supported on tpu",
    "ldexp": "two bfloat16 gradient elements; not investigated yet",
    "linspace": "integer linspace rounds 7 of 50 values differently from torch's kernel; "
                "not matched yet",
    "linspace.tensor_overload": "integer linspace rounds 7 of 50 values differently from "
                                "torch's kernel; not matched yet",
    "logspace": "bfloat16/int64 rounding of base ** x at one element; not matched yet",
    "logspace.tensor_overload": "bfloat16/int64 rounding of base ** x at one element; not "
                                "matched yet",
    "logcumsumexp": "inputs of 1e4: float32 rounding of the gradient's exp and log sums; as "
                    "far from a float64 reference as CPU's own result (3e-3 vs 2e-3)",
    "nn.functional.conv_transpose3d": "one element 2e-5 off: float32 accumulation order",
    "pca_lowrank": "randomized algorithm: singular vectors are unique only up to sign",
    "svd_lowrank": "randomized algorithm: singular vectors are unique only up to sign",
}


def _reason(name: str, r: dict) -> str:
    cause = CAUSES.get(name)
    detail = f"{r.get('kind')}: {r.get('detail', '')}"
    return f"{detail} -- {cause}" if cause else detail


_SHAPES = {"ops": "op -> dtype -> reason", "models": "model type -> reason",
           "conformance": "op -> 'family mode' -> reason"}
# a model type that fails on CPU under the harness says nothing about tpu: not a failure
_NOT_FAILED = ("pass", "cpu_fail")


def expected_failures(kind: str, results: dict) -> dict:
    """A Strict sweep's failures, each with its reason: for ops, op -> dtype -> reason for
    every failing pair; for models, model type -> reason for every type that runs on CPU
    but not on tpu (an error, a mismatch, a timeout)."""
    out: dict = {}
    for name in sorted(results):
        if kind == "models":
            r = results[name]
            if r["status"] not in _NOT_FAILED:
                out[name] = f"{r.get('error')}: {r.get('detail')}"
            continue
        for d, r in sorted(results[name].items()):
            if r["status"] == "fail":
                out.setdefault(name, {})[d] = _reason(name, r)
    return out


def write_expected(kind: str, results: dict, folder: pathlib.Path = EXPECTED) -> None:
    """Regenerate expected/KIND.json from a Strict sweep's merged results."""
    body = {"_generated": f"by `python -m torch_tpu validate {kind}` and `validate report` "
                          "(Strict mode) from the sweep's results; do not edit by hand, rerun "
                          f"the sweep: {_SHAPES[kind]}",
            **expected_failures(kind, results)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{kind}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def load_expected(kind: str, folder: pathlib.Path = EXPECTED) -> dict:
    """The expected failures of `kind` ("ops" or "models"), as write_expected wrote them."""
    path = folder / f"{kind}.json"
    if not path.exists():
        return {}
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


_CELL = {"pass": "pass", "fail": "**FAIL**", "cpu_fail": "cpu-fail", "unsupported": "·"}


def ops_markdown(data: dict, dtypes, mode: str) -> str:
    results = data["results"]
    s = ops_summary(results, dtypes)
    lines = [f"Mode: **{mode}**. {len(results)} OpInfo entries of `op_db`, dtypes "
             f"{', '.join(dtypes)}; forward on every sample, and gradients under a random "
             "cotangent for differentiable ops in floating dtypes.",
             "",
             f"**{s['tpu_pass']} of {s['cpu_pairs']} op × dtype pairs that run on CPU pass on "
             f"tpu: {100 * s['rate']:.1f}%** (target ≥ {100 * OPS_TARGET:.0f}%: "
             f"{'met' if s['rate'] >= OPS_TARGET else 'NOT met'}).", ""]
    rows = []
    for d in dtypes:
        c = s["per_dtype"][d]
        n = c["pass"] + c["fail"]
        rows.append([d, n, c["pass"], c["fail"], f"{100 * c['pass'] / n:.1f}%" if n else "-",
                     c["cpu_fail"], c["unsupported"]])
    lines += [common.markdown_table(["dtype", "pairs run on CPU", "pass on tpu", "fail on tpu",
                                     "rate", "no sample runs on CPU", "not a CPU dtype"],
                                    rows), ""]
    kinds = failure_kinds(results)
    if kinds:
        lines += ["Failures by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common())
                  + ".", ""]
    miss = missing_lowerings(results)
    if miss:
        lines += ["Missing lowerings (aten op: failing pairs):", "",
                  common.markdown_table(["aten op", "pairs"],
                                        [[f"`{k}`", n] for k, n in miss.most_common()]), ""]
    fails = [[f"`{name}`", d, r.get("kind"), _md(r.get("detail", "")),
              _md(CAUSES.get(name, ""))]
             for name, by in sorted(results.items()) for d, r in sorted(by.items())
             if r["status"] == "fail"]
    if fails:
        lines += ["<details><summary>Every failing pair, with its reason</summary>", "",
                  common.markdown_table(["op", "dtype", "kind", "what differed", "why"], fails), "",
                  "</details>", ""]
    table = [[f"`{name}`"] + [_CELL.get(by.get(d, {}).get("status"), "") for d in dtypes]
             for name, by in sorted(results.items())]
    lines += ["<details><summary>Every op</summary>", "",
              "`·`: CPU does not support the dtype; cpu-fail: no sample runs on CPU.", "",
              common.markdown_table(["op", *dtypes], table), "", "</details>"]
    return "\n".join(lines)


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")[:240]


# ---------------------------------------------------------------- models
def models_summary(results: dict) -> dict:
    st = collections.Counter(r["status"] for r in results.values())
    cpu = sum(n for k, n in st.items() if k != "cpu_fail")
    return {"status": st, "types": len(results), "cpu_ran": cpu, "tpu_pass": st["pass"],
            "rate": st["pass"] / cpu if cpu else 0.0}


def model_failure_classes(results: dict, statuses=("tpu_error", "mismatch", "timeout")):
    c = collections.Counter()
    for r in results.values():
        if r["status"] in statuses:
            c[r.get("detail") if r.get("kind") == "missing_lowering" else r.get("error")] += 1
    return c


def models_markdown(data: dict, mode: str, timm: str) -> str:
    results = data["results"]
    s = models_summary(results)
    st = s["status"]
    lines = [f"Mode: **{mode}**. {s['types']} model types (transformers' causal-LM, masked-LM, "
             "sequence-classification, image-classification and base mappings), each shrunk to "
             "a tiny config with random weights; forward on tpu against CPU with the same "
             "weights (the logits, or a base model's hidden state), then one training step "
             "(the head's loss, backward, AdamW) judged against float64 (results stored "
             "before 2026-12-07 judged the forward and a causal LM's gradients only). "
             "timm: " + timm + ".", "",
             f"**{s['cpu_ran']} types run on CPU under the harness** (target ≥ "
             f"{MODELS_CPU_TARGET}: {'met' if s['cpu_ran'] >= MODELS_CPU_TARGET else 'NOT met'}); "
             f"**{s['tpu_pass']} of them match on tpu: {100 * s['rate']:.1f}%** (target ≥ "
             f"{100 * MODELS_TARGET:.0f}%: {'met' if s['rate'] >= MODELS_TARGET else 'NOT met'}).",
             "", "Status: " + ", ".join(f"{k} {n}" for k, n in st.most_common()) + ".", ""]
    by_task = collections.defaultdict(collections.Counter)
    for r in results.values():
        by_task[r["task"]][r["status"]] += 1
    rows = [[t, sum(c.values()), sum(c.values()) - c["cpu_fail"], c["pass"],
             c["tpu_error"] + c["mismatch"] + c["timeout"], c["cpu_fail"]]
            for t, c in by_task.items()]
    lines += [common.markdown_table(["task", "types", "run on CPU", "match on tpu",
                                     "fail on tpu", "fail on CPU"], rows), ""]
    fc = model_failure_classes(results)
    if fc:
        lines += ["tpu failures by class:", "",
                  common.markdown_table(["class", "types"],
                                        [[_md(str(k)), n] for k, n in fc.most_common()]), ""]
    cc = model_failure_classes(results, ("cpu_fail",))
    if cc:
        lines += ["Types the harness cannot run on CPU, by error class: " +
                  ", ".join(f"{k} {n}" for k, n in cc.most_common()) + ".", ""]
    table = [[f"`{mt}`", r["task"], r["arch"], r.get("level", ""), r.get("inputs", ""),
              r["status"] + (" (random: statistics)" if r.get("random") else ""),
              r.get("error", ""), _md(r.get("detail", ""))[:160]]
             for mt, r in sorted(results.items())]
    lines += ["<details><summary>Every model type</summary>", "",
              common.markdown_table(["type", "task", "architecture", "shrink", "inputs",
                                     "status", "error class", "detail"], table), "",
              "</details>"]
    return "\n".join(lines)


# ---------------------------------------------------------------- docs
def write_docs(out: pathlib.Path, name: str, title: str, body: str, runs: list) -> None:
    """Replace this sweep's section of OUT/VALIDATION.md."""
    md = out / "VALIDATION.md"
    if not md.exists():
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(HEADER)
    cmds = "\n".join(f"- `{r['command']}` ({r['started']})" for r in runs[-40:])
    body = f"Produced by these runs (chunks merge into one result set):\n\n{cmds}\n\n{body}"
    common.write_section(name, title, body, md)


def plot(out: pathlib.Path, ops_data: dict | None, models_data: dict | None, dtypes) -> None:
    """The coverage plot, OUT/validation_coverage.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    if ops_data:
        s = ops_summary(ops_data["results"], dtypes)
        ran = [s["per_dtype"][d]["pass"] + s["per_dtype"][d]["fail"] for d in dtypes]
        ok = [s["per_dtype"][d]["pass"] for d in dtypes]
        ax.bar(dtypes, ran, color="#cccccc", label="run on CPU")
        ax.bar(dtypes, ok, color="#2a9d8f", label="pass on tpu")
        for i, (a, b) in enumerate(zip(ok, ran)):
            ax.text(i, a, f"{100 * a / b:.0f}%" if b else "", ha="center", va="bottom")
        ax.set_title(f"OpInfo op × dtype pairs: {100 * s['rate']:.1f}% pass")
        ax.legend(fontsize=8)
    ax = axes[1]
    if models_data:
        res = models_data["results"]
        tasks = [t for t, _ in _tasks() if any(r["task"] == t for r in res.values())]
        stat = {t: collections.Counter(r["status"] for r in res.values() if r["task"] == t)
                for t in tasks}
        bottom = [0] * len(tasks)
        for key, color, label in [("pass", "#2a9d8f", "match on tpu"),
                                  ("fail", "#e76f51", "fail on tpu"),
                                  ("cpu_fail", "#cccccc", "harness fails on CPU")]:
            vals = [stat[t]["pass"] if key == "pass" else stat[t]["cpu_fail"] if
                    key == "cpu_fail" else sum(stat[t].values()) - stat[t]["pass"] -
                    stat[t]["cpu_fail"] for t in tasks]
            ax.bar(tasks, vals, bottom=bottom, color=color, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        s = models_summary(res)
        ax.set_title(f"transformers model types: {s['tpu_pass']}/{s['cpu_ran']} match "
                     f"({s['types']} types)")
        ax.legend(fontsize=8)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "validation_coverage.png", dpi=100)
    plt.close(fig)


def _tasks():
    from .models import TASKS

    return TASKS


# ---------------------------------------------------------------- conformance
CONFORMANCE_HEADER = """# Conformance: PyTorch's device-generic op checks on tpu

What PyTorch's own device-generic tests ask of a device (test/test_ops.py: results against
CPU, `out=`, its warnings, error inputs, non-contiguous samples, variants, dtypes), asked of
tpu over the whole OpInfo database in Strict, DeferAndFuse and compiled
(`torch.compile(backend="tpu")`). The checks are torch_tpu_tools/validation/conformance.py;
tests/ops/test_conformance.py runs a sample of ops through torch's `instantiate_device_type_tests`
in the default test run. Expected failures, each with its reason, are generated into
torch_tpu_tools/validation/expected/conformance.json from the sweep.

Run it (`--mode strict|defer_and_fuse|compiled`, `--families`, `--ops`, `--shard I/N`; each
run merges into docs/validation/conformance-MODE.json and rewrites this page):

    python -m torch_tpu validate conformance --mode strict

As PyTorch's CI runs test_ops.py, one process for the whole file, so that what one check
leaves behind (programs held, buffers, pending work) meets the next and a crash shows:

    python -m torch_tpu validate conformance --sample --single-process --mode defer_and_fuse

runs the 66 common ops of conformance.SAMPLE in one child process; a crash ends the run and
fails it (exit status 1), naming the check it died in. (The default restarts a child after
a crash and counts it against that check only. A DeferAndFuse process running PyTorch's own
TestCommon died at its ~1,700th program, out of memory mappings: _maps.py.)

A column covers the ops its mode's runs covered (listed below): each, the whole database.
Compiled, dynamo compiles every sample anew: its sweep took ~55 minutes on a 2-core machine
in 8 shards (`--shard I/8`).

Cells: passed / checked (the percentage), where "checked" leaves out ops the family has
nothing to ask of (no out= variant, no error inputs, a random op's variants), ops whose
samples do not run on CPU, and the "declared" ones: checks whose test in torch's
test/test_ops.py the op's own OpInfo marks `unittest.skip` or `expectedFailure` on every
device (torch's suite, run for tpu, would not count them either; e.g. `test_compare_cpu`
for the integer casts, `test_out_warning` for `addbmm`, `lu`, `bernoulli`).

How each family judges (CPU is the reference wherever the answer is CPU's behaviour):
`compare` runs the first 16 `reference_inputs` of each op (forward and gradients, the
OpInfo sweep's judge: a float32 result that misses CPU's passes when it is as close to
CPU's float64 computation as CPU's own result, a bfloat16/float16 one when it matches CPU's
float32 computation rounded at the end, a gradient of one elementwise input when CPU's
scalar loop, element by element, gives it: CPU's vectorized loop disagrees with its scalar
loop and CUDA at NaN inputs of hardtanh, relu6, softshrink, elu, selu and celu; `dtypes`
judges alike); `out` holds an out's values
to CPU's out= values (to CPU's values into a right-sized out for a non-contiguous one: torch
2.13's CPU gelu.out and _softmax.out mishandle those; eigenvectors by their sign-free
reconstruction) and requires a right-sized out to keep its strides; `out_warning` asks
torch's rule (a resized non-empty out warns, a right-sized one does not), not CPU's habit;
`errors` skips a case CPU itself does not refuse as the OpInfo says; compiled mode compares
with CPU under dynamo (`aot_eager`) where dynamo's own refusals differ from eager's.

Ops that run on CPU as a listed fallback (lowering/decomp.py `CPU_FALLBACKS`, counted in
`torch_tpu.metrics`): `linalg.ldl_factor(_ex)` and `linalg.ldl_solve`, LAPACK's own pivoted
LDL^T format.

## Platform limits (not counted as failures of the checks above)

- **Subnormal (denormal) numbers in arithmetic, on XLA:CPU.** jaxlib's CPU client runs
  every program with flush-to-zero and denormals-are-zero set in the executing thread
  (`tsl::port::ScopedFlushDenormal` in PJRT's CPU client, and in XLA's pool threads), and
  nothing outside jaxlib changes it: the `xla_cpu_ftz` flag only sets LLVM's function
  attribute, and jaxlib exports no symbol to replace. Subnormals survive every data
  movement (upload, download, copies, views, `cat`: tests/ops/test_out_variants.py);
  arithmetic that reads or makes one gives 0, where CPU eager keeps them (float64
  `1e-300 * 1e-10` is 0.0 on tpu, 1e-310 on CPU; float32 below 1.2e-38 likewise). An error
  instead of the zero would need each float result recomputed without the flush, which
  nothing in the program can do. On the hardware: TPUs flush float32 and bfloat16
  subnormals to zero, and have no float64 units (XLA:TPU computes float64 in pairs of
  float32, within float32's exponent range); XLA:GPU keeps subnormals (`xla_gpu_ftz`
  defaults to false), as CUDA does. tests/ops/test_refusals.py keeps a strict expected
  failure that turns red once a jaxlib keeps them.
- **Rounding of float32 division and ramps, on XLA.** XLA's algebraic simplifier turns
  `a / broadcast(b)` into `a * (1 / b)`, one ulp off in about a quarter of the elements;
  torch's kernels divide correctly rounded. The division lowering keeps a divisor smaller
  than the result a full-size operand on XLA:CPU, which XLA divides exactly
  (lowering/pointwise.py; bit for bit in both eager modes and compiled:
  tests/ops/test_pointwise.py), but a divisor broadcast by an earlier op of the same graph
  still meets the rewrite. ATen's CPU `linspace` (and CUDA's) computes `start + step * i`
  with a fused multiply-add, which JAX cannot ask XLA for: a ramp with a fractional step
  (`linspace(-3, 10, 101)`) differs from CPU's in one ulp at some elements. Both are
  within every tolerance; a model whose gradient jumps where such a value lands (bilinear
  sampling at pixel centres) shows them (docs/VALIDATION.md, GroundingDINO).
- **Sparse layouts** (`torch.sparse_csr`, ...) have no tpu kernels: ops on them refuse with
  torch's "Could not run ... SparseCsrtpu" error.
"""


def conformance_table(by_mode: dict) -> tuple[str, list]:
    """The family x mode table of stored results (mode -> results), and the failures."""
    from .conformance import FAMILIES, declared
    from .ops import op_db, op_name

    modes = [m for m in by_mode if by_mode[m]["results"]]
    infos = {op_name(o): o for o in op_db()}

    def status(name, fam, r):  # results stored before `declared` existed are judged here
        o = infos.get(name)
        checked = r["status"] in ("pass", "fail")
        return "declared" if checked and o is not None and declared(fam, o) else r["status"]

    lines = ["| family | " + " | ".join(modes) + " |", "| --- |" + " ---: |" * len(modes)]
    failures = []
    for fam in FAMILIES:
        cells = []
        for m in modes:
            c = collections.Counter(status(n, fam, r[fam])
                                    for n, r in by_mode[m]["results"].items() if fam in r)
            checked = c["pass"] + c["fail"]
            left_out = f", {c['declared']} declared" if c["declared"] else ""
            cells.append(f"{c['pass']} / {checked} ({100 * c['pass'] / checked:.1f}%){left_out}"
                         if checked else "not run")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    for m in modes:
        for name, by in sorted(by_mode[m]["results"].items()):
            for fam, r in sorted(by.items()):
                if status(name, fam, r) == "fail":
                    failures.append((name, fam, m, r.get("detail", "")))
    return "\n".join(lines), failures


_NAN_KINK = ("a reference sample with NaN inputs: CPU's vectorized backward gives 0 there, "
             "its own scalar path (small tensors) and tpu pass the gradient through; CPU's "
             "vectorized form fails the 9-element NaN sample instead")
_NORM_STATS = ("mean/rstd of a bfloat16 input: CPU returns them in bfloat16, torch's meta "
               "kernel (every other device) and CUDA in float32, as tpu does")
# why a conformance check fails where it is known: op -> cause, or (op, family) -> cause
# (then the OpInfo sweep's CAUSES); the expected failures carry it after the detail
CONFORMANCE_CAUSES = {
    **{(n, "compare"): _NAN_KINK for n in ("nn.functional.hardtanh", "nn.functional.relu6",
                                           "nn.functional.softshrink", "nn.functional.elu",
                                           "nn.functional.celu", "nn.functional.selu")},
    ("special.log_ndtr", "compare"): "the gradient exp(-(log_ndtr(x) + x^2/2)) cancels "
                                     "catastrophically at x = -1000 in float32: one ulp of the "
                                     "forward moves it 3%, on CPU as on tpu",
    **{(n, "dtypes"): _NORM_STATS for n in ("native_layer_norm", "native_batch_norm",
                                            "_native_batch_norm_legit",
                                            "_batch_norm_with_update")},
    ("nn.functional.silu.complex", "compare"): "x / (1 + exp(-x)) where exp overflows: CPU's "
                                               "complex division gives NaN, XLA's the limit 0",
}


def _conformance_reason(name: str, family: str, detail: str) -> str:
    cause = (CONFORMANCE_CAUSES.get((name, family)) or CONFORMANCE_CAUSES.get(name)
             or CAUSES.get(name))
    return f"{detail} -- {cause}" if cause else detail


def write_conformance(out: pathlib.Path, modes, folder: pathlib.Path = EXPECTED) -> None:
    """OUT/CONFORMANCE.md from the stored results of every mode, and the expected failures
    (expected/conformance.json) from the same."""
    by_mode = {m: load(out, "conformance", m) for m in modes}
    table, failures = conformance_table(by_mode)
    runs = [r for m in modes for r in by_mode[m]["meta"]["runs"]]
    cmds = "\n".join(f"- `{r['command']}` ({r['started']})" for r in runs[-40:])
    body = [CONFORMANCE_HEADER, "## Results\n", f"Produced by these runs:\n\n{cmds}\n", table,
            "\n## Failures\n", "| op | family | mode | why |", "| --- | --- | --- | --- |"]
    body += [f"| {n} | {f} | {m} | "
             f"{_conformance_reason(n, f, d[:200]).replace('|', '/').replace(chr(10), ' ')} |"
             for n, f, m, d in failures]
    (out / "CONFORMANCE.md").write_text("\n".join(body) + "\n")
    expected: dict = {}
    for n, f, m, d in failures:
        expected.setdefault(n, {})[f"{f} {m}"] = _conformance_reason(n, f, d)
    head = {"_generated": "by `python -m torch_tpu validate conformance` from the sweep's "
                          f"results; do not edit by hand, rerun the sweep: {_SHAPES['conformance']}"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conformance.json").write_text(
        json.dumps({**head, **expected}, indent=1, sort_keys=True) + "\n")
