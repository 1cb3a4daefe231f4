"""The second referee's section of VALIDATION.md (`validate referee`): PyTorch's dynamo
Hugging Face list under that suite's accuracy protocol, one column per mode, and a plot of
the pass counts beside the zoo's."""
from __future__ import annotations

import collections
import pathlib

from ..bench import common
from . import referee, report, zoo_report
from .zoo_report import MODES

_CPU = ("eager_fail_to_run", "eager_two_runs_differ", "cpu_fail")


def load(out: pathlib.Path) -> dict:
    """mode -> stored data, for the modes that have referee results in OUT."""
    data = {m: report.load(out, "referee", m) for m in MODES}
    return {m: d for m, d in data.items() if d["results"]}


def counts(results: dict) -> dict:
    st = collections.Counter(r["status"] for r in results.values())
    ran = len(results) - sum(st[s] for s in _CPU)
    return {"models": len(results), "ran": ran, "pass": st["pass"], "status": st}


def brief(results: dict) -> str:
    c = counts(results)
    return (f"{c['models']} models, {c['ran']} run on CPU, {c['pass']} pass on tpu; "
            + ", ".join(f"{k} {n}" for k, n in c["status"].most_common()))


def _cell(r: dict | None) -> str:
    if r is None:
        return "not run"
    if r["status"] == "pass":
        return "pass" if r.get("reference") == "float64" else f"pass ({r.get('reference')})"
    return f"**{r['status']}**: {report._md(r.get('detail', ''))[:100]}"


def markdown(by_mode: dict) -> str:
    modes = list(by_mode)
    rows = []
    for m in modes:
        c = counts(by_mode[m]["results"])
        when = max((r["started"] for r in by_mode[m]["meta"]["runs"]), default="?")
        rows.append([m, when, c["models"], c["ran"], c["pass"],
                     f"{100 * c['pass'] / c['ran']:.1f}%" if c["ran"] else "-"])
    per_model = [[f"`{n}`", referee.SUITE_SKIPS.get(n, "")] +
                 [_cell(by_mode[m]["results"].get(n)) for m in modes] for n in referee.MODELS]
    return "\n".join([
        "PyTorch's dynamo Hugging Face benchmark list (benchmarks/dynamo/"
        "huggingface_models_list.txt, without its hub-checkpoint rows, which its yaml skips "
        "on CPU), judged by that suite's own accuracy protocol with tpu in the compiled "
        "backend's place: CPU eager twice (they must agree exactly), a float64 copy, then "
        f"{referee.ITERATIONS} training steps on tpu (loss = pred[0], backward, the suite's "
        "Adam or SGD at lr 0.01), the loss, every gradient, parameter and buffer passing "
        "`same()` (allclose at tol 1e-2, or an RMSE from float64 within 2x, 3x for small "
        "tensors, CPU float32's plus tol / 10). Shrunk to fit: batch 1 (the suite's own in "
        f"accuracy mode), {referee.SEQ} tokens, 2 layers and widths as the real-config "
        "variants shrink them, dropout 0 (validation/referee.py). The suite's own skips are "
        "listed; those models run here all the same.", "",
        "![referee](validation_referee.png)", "",
        common.markdown_table(["mode", "last run", "models", "run on CPU", "pass", "rate"],
                              rows), "",
        common.markdown_table(["model", "the suite skips it", *modes], per_model)])


def write(out: pathlib.Path) -> None:
    by_mode = load(out)
    if not by_mode:
        return
    zoo = zoo_report.load(out)
    rates = {}
    for m in MODES:  # the referee's pass rate beside the zoo's, per mode
        got = []
        for data in (by_mode.get(m), zoo.get(m)):  # (the zoo's statuses count alike)
            n = counts(data["results"]) if data else None
            got.append(100 * n["pass"] / n["ran"] if n and n["ran"] else float("nan"))
        if any(v == v for v in got):
            rates[m] = got
    zoo_report.bars(out / "validation_referee.png", ["dynamo HF list", "our model zoo"],
                    rates, "% of what runs on CPU that matches on tpu",
                    "the second referee beside our own sweep, per mode")
    runs = sorted((r for d in by_mode.values() for r in d["meta"]["runs"]),
                  key=lambda r: r["started"])
    report.write_docs(out, "validate-referee", "Second referee: the dynamo Hugging Face list",
                      markdown(by_mode), runs)
