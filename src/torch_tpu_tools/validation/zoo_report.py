"""The model zoo across modes: one column per mode for every type in VALIDATION.md, and
the expected failures of every mode (expected/models.json: type -> mode -> reason), the
one home the default test run reads its xfails from (tests/tools/test_validation.py).

A column is dated by its mode's last run. A result stored by an older harness (another
`models.HARNESS`) judged the forward only; its cell says so.
"""
from __future__ import annotations

import collections
import json
import pathlib

from ..bench import common
from . import report

MODES = ("strict", "defer_and_fuse", "compiled", "debug")
_FAILED = ("tpu_error", "mismatch", "timeout", "crash")


def load(out: pathlib.Path) -> dict:
    """mode -> stored data, for the modes that have results in OUT."""
    data = {m: report.load(out, "models", m) for m in MODES}
    return {m: d for m, d in data.items() if d["results"]}


def _cell(r: dict | None) -> str:
    if r is None:
        return "not run"
    status = r["status"]
    if status == "pass":
        how = "forward only" if "harness" not in r and "train" not in r else \
            ("random: statistics" if r.get("random") else f"step: {r['train']}")
        if r.get("topk_as_cpu"):  # validation/selection.py
            how += f"; {r['topk_as_cpu']} top-k near-ties taken as CPU's"
        return f"pass ({how})"
    if status == "cpu_fail":
        return "cpu_fail"
    return f"**{status}**: {report._md(r.get('detail', ''))[:110]}"


def _summary(mode: str, d: dict) -> list:
    res = d["results"]
    st = collections.Counter(r["status"] for r in res.values())
    ran = len(res) - st["cpu_fail"]
    trained = sum(1 for r in res.values() if r["status"] == "pass" and
                  r.get("train", "none") != "none")
    runs = d["meta"]["runs"]
    when = max((r["started"] for r in runs), default="?")
    return [mode, when, len(res), ran, st["pass"],
            f"{100 * st['pass'] / ran:.1f}%" if ran else "-", trained,
            sum(st[s] for s in _FAILED)]


def markdown(by_mode: dict) -> str:
    modes = list(by_mode)
    types = sorted({t for d in by_mode.values() for t in d["results"]})
    rows = [_summary(m, by_mode[m]) for m in modes]
    lines = ["Each column is one mode's sweep (`python -m torch_tpu validate models --mode "
             "M`): the forward against CPU, then one training step (forward, the head's "
             "loss, backward, AdamW) judged against a float64 CPU step as PyTorch's dynamo "
             "accuracy checks judge backends (validation/training.py). `compiled` is "
             "`torch.compile(model, backend=\"tpu\")` on the forward and the step.", "",
             common.markdown_table(["mode", "last run", "types", "run on CPU", "match",
                                    "rate", "of them with a training step judged",
                                    "fail on tpu"], rows), ""]
    table = []
    for t in types:
        first = next(d["results"][t] for d in by_mode.values() if t in d["results"])
        table.append([f"`{t}`", first.get("task", "")] +
                     [_cell(by_mode[m]["results"].get(t)) for m in modes])
    lines += ["<details><summary>Every model type, every mode</summary>", "",
              common.markdown_table(["type", "task", *modes], table), "", "</details>"]
    return "\n".join(lines)


def plot(path: pathlib.Path, by_mode: dict) -> None:
    """Pass rate per task, one bar per mode, of the types that run on CPU."""
    tasks = sorted({r.get("task", "") for d in by_mode.values() for r in d["results"].values()})
    rates = {}
    for mode, d in by_mode.items():
        rates[mode] = []
        for t in tasks:
            rs = [r for r in d["results"].values() if r.get("task") == t and
                  r["status"] != "cpu_fail"]
            rates[mode].append(100 * sum(r["status"] == "pass" for r in rs) / len(rs)
                               if rs else 0)
    bars(path, tasks, rates, "% of types that run on CPU",
         "model zoo: forward and training step match, per mode")


def bars(path: pathlib.Path, groups: list, rates: dict, ylabel: str, title: str,
         width_in: float = 9, rotate: bool = False) -> None:
    """A percentage per group, one bar per mode (rates: mode -> a value per group, NaN
    where that mode did not run the group)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width_in, 4))
    width = 0.8 / len(rates)
    for i, (mode, values) in enumerate(rates.items()):
        bars = ax.bar([j + i * width for j in range(len(groups))],
                      [0 if v != v else v for v in values], width, label=mode)
        if len(groups) <= 4:  # (few bars: each one's figure, as a near-100 bar hides it)
            ax.bar_label(bars, ["not run" if v != v else f"{v:.1f}" for v in values],
                         fontsize=7)
    ax.set_xticks([j + width * (len(rates) - 1) / 2 for j in range(len(groups))], groups,
                  **({"rotation": 45, "ha": "right"} if rotate else {}))
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def expected(by_mode: dict) -> dict:
    """type -> mode -> reason, for every type that runs on CPU and fails on tpu."""
    out: dict = {}
    for mode, d in by_mode.items():
        for t, reason in report.expected_failures("models", d["results"]).items():
            out.setdefault(t, {})[mode] = reason
    return out


def write(out: pathlib.Path, expected_too: bool, folder: pathlib.Path = report.EXPECTED):
    """The by-mode section of OUT/VALIDATION.md; with `expected_too` (OUT is the
    repository's docs) also expected/models.json."""
    by_mode = load(out)
    if not by_mode:
        return
    runs = [r for d in by_mode.values() for r in d["meta"]["runs"]]
    out.mkdir(parents=True, exist_ok=True)
    plot(out / "validation_models_modes.png", by_mode)
    report.write_docs(out, "validate-models-by-mode", "Model-zoo sweep, every mode",
                      "![per mode](validation_models_modes.png)\n\n" + markdown(by_mode),
                      sorted(runs, key=lambda r: r["started"]))
    if expected_too:
        head = {"_generated": "by `python -m torch_tpu validate models` and `validate report` "
                              "from every mode's stored results; do not edit by hand, rerun "
                              "the sweep: model type -> mode -> reason"}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "models.json").write_text(
            json.dumps({**head, **expected(by_mode)}, indent=1, sort_keys=True) + "\n")
