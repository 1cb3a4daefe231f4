"""The real-config variants' section of VALIDATION.md (`validate variants`), every mode
side by side: per variant, how many (type, variant) configurations run on CPU and how
many of them match on tpu, then every failure with its reason, and a plot."""
from __future__ import annotations

import collections
import pathlib

from ..bench import common
from . import report, variants, zoo_report
from .zoo_report import MODES

_FAILED = ("tpu_error", "mismatch", "timeout", "crash")


def load(out: pathlib.Path) -> dict:
    """mode -> {(type, variant): result}, for the modes that have results in OUT."""
    by_mode = {}
    for m in MODES:
        d = report.load(out, "variants", m)
        flat = {(t, v): r for t, by in d["results"].items() for v, r in by.items()}
        if flat:
            by_mode[m] = (d, flat)
    return by_mode


def counts(results: list) -> dict:
    st = collections.Counter(r["status"] for r in results)
    built = len(results) - st["unsupported"]
    ran = built - st["cpu_fail"]
    return {"configs": built, "ran": ran, "pass": st["pass"],
            "failed": sum(st[s] for s in _FAILED), "status": st}


def brief(results: list) -> str:
    c = counts(results)
    return (f"{c['configs']} configurations, {c['ran']} run on CPU, {c['pass']} match on tpu; "
            + ", ".join(f"{k} {n}" for k, n in c["status"].most_common()))


def _rate(c: dict) -> str:
    return f"{c['pass']}/{c['ran']}" + (f" ({100 * c['pass'] / c['ran']:.1f}%)" if c["ran"]
                                        else "")


def markdown(by_mode: dict) -> str:
    modes = list(by_mode)
    rows = []
    for m in modes:
        d, flat = by_mode[m]
        c = counts(list(flat.values()))
        when = max((r["started"] for r in d["meta"]["runs"]), default="?")
        rows.append([m, when, c["configs"], c["ran"], c["pass"],
                     f"{100 * c['pass'] / c['ran']:.1f}%" if c["ran"] else "-", c["failed"]])
    per_variant = []
    for v in variants.VARIANTS:
        per_variant.append([v] + [_rate(counts([r for (_, vv), r in by_mode[m][1].items()
                                                if vv == v])) for m in modes])
    fails = []
    for m in modes:
        for (t, v), r in sorted(by_mode[m][1].items()):
            if r["status"] in _FAILED or r["status"] == "cpu_fail":
                fails.append([f"`{t}`", v, m, r["status"],
                              report._md(f"{r.get('error', '')}: {r.get('detail', '')}")[:160]])
    return "\n".join([
        "Each causal-LM, masked-LM and sequence-classification type from its default "
        "(released) config, shrunk in depth and width only (2 layers, at most "
        f"{variants.HEADS} heads of the config's own head dimension, widths scaled alike, "
        f"vocabulary capped at {variants.MAX_VOCAB}), with one backend-breaking feature "
        "switched on at a time where the config has a field for it "
        "(validation/variants.py). Each configuration runs the model sweep's check: the "
        "forward and one AdamW training step, judged against float64.", "",
        "![variants](validation_variants.png)", "",
        common.markdown_table(["mode", "last run", "configurations", "run on CPU", "match",
                               "rate", "fail on tpu"], rows), "",
        common.markdown_table(["variant", *modes], per_variant), "",
        "<details><summary>Every failure</summary>", "",
        common.markdown_table(["type", "variant", "mode", "status", "detail"], fails)
        if fails else "none", "", "</details>"])


def plot(path: pathlib.Path, by_mode: dict) -> None:
    """Match rate per variant, one bar per mode, of the configurations that run on CPU."""
    names = list(variants.VARIANTS)
    rates = {}
    for mode, (_, flat) in by_mode.items():
        cs = [counts([r for (_, vv), r in flat.items() if vv == v]) for v in names]
        rates[mode] = [100 * c["pass"] / c["ran"] if c["ran"] else 0 for c in cs]
    zoo_report.bars(path, names, rates, "% of configurations that run on CPU",
                    "real-config variants: forward and training step match, per mode",
                    width_in=11, rotate=True)


def write(out: pathlib.Path) -> None:
    by_mode = load(out)
    if not by_mode:
        return
    runs = sorted((r for d, _ in by_mode.values() for r in d["meta"]["runs"]),
                  key=lambda r: r["started"])
    plot(out / "validation_variants.png", by_mode)
    report.write_docs(out, "validate-variants", "Real-config variants", markdown(by_mode),
                      runs)
