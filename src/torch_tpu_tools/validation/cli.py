"""`python -m torch_tpu validate ops|models|variants|referee|conformance|torchtitan|report`.

A run may cover a chunk (`--ops`, `--types`, `--shard I/N`): its results merge into
OUT/validation/<kind>-<mode>.json (`--out`, default ./docs), and the reports
(OUT/VALIDATION.md, the coverage plot, and in Strict mode the expected failures,
report.EXPECTED) are regenerated from the merged results.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from ..bench import common
from . import _env, torchtitan
from .conformance import MODES as CONFORMANCE_MODES, SAMPLE as CONFORMANCE_SAMPLE

MODES = ("strict", "debug", "defer_and_fuse")
MODEL_MODES = MODES + ("compiled",)  # compiled: torch.compile(model, backend="tpu")
_WRITES = "the results (validation/*.json), VALIDATION.md and the coverage plot"


HELP = "sweeps on tpu vs CPU: validate ops|models|report (OUT/VALIDATION.md)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="what",
                           metavar="ops|models|variants|referee|conformance|torchtitan|report",
                           required=True)
    o = sub.add_parser("ops", help="the OpInfo sweep: every op of op_db, tpu vs CPU")
    o.add_argument("--mode", choices=MODES, default="strict")
    o.add_argument("--dtype", default="float32,bfloat16,int64,bool",
                   help="comma-separated dtypes (default: all four)")
    o.add_argument("--ops", default="", help="comma-separated op_db names (default: all)")
    o.add_argument("--no-grad", action="store_true", help="forward only")
    o.add_argument("--rerun-failed", action="store_true",
                   help="only the pairs that failed in the stored results of this mode")
    _common(o, timeout=300)
    m = sub.add_parser("models", help="the model-zoo sweep: transformers model types, tpu vs CPU")
    m.add_argument("--mode", choices=MODEL_MODES, default="strict")
    m.add_argument("--types", default="", help="comma-separated model types (default: all)")
    m.add_argument("--cpu-only", action="store_true",
                   help="only check that the harness runs each type on CPU (shrinker work)")
    m.add_argument("--resume", action="store_true",
                   help="skip the types this mode's stored results already hold from the "
                        "current harness (a killed shard picks up where it stopped)")
    _common(m, timeout=600)
    v = sub.add_parser("variants", help="real-config variants of the causal-LM, masked-LM "
                                        "and classifier types (GQA, sliding window, RoPE "
                                        "scaling, MoE top-1, biases, bf16, ...): a training "
                                        "step each, tpu vs CPU")
    v.add_argument("--mode", choices=MODEL_MODES, default="defer_and_fuse")
    v.add_argument("--types", default="", help="comma-separated model types (default: all)")
    v.add_argument("--variants", default="", help="comma-separated variants (default: all)")
    v.add_argument("--resume", action="store_true",
                   help="skip the (type, variant) pairs this mode's stored results hold")
    _common(v, timeout=600)
    e = sub.add_parser("referee", help="a second referee: PyTorch's dynamo Hugging Face "
                                       "benchmark list under that suite's accuracy protocol")
    e.add_argument("--mode", choices=MODEL_MODES, default="strict")
    e.add_argument("--models", default="", help="comma-separated names of the list "
                                                "(default: all)")
    e.add_argument("--resume", action="store_true",
                   help="skip the models this mode's stored results hold")
    _common(e, timeout=600)
    c = sub.add_parser("conformance", help="PyTorch's device-generic op checks (out=, errors, "
                                            "variants, ...) over op_db: docs/CONFORMANCE.md")
    c.add_argument("--mode", choices=CONFORMANCE_MODES, default="strict")
    c.add_argument("--families", default="", help="comma-separated families (default: all)")
    c.add_argument("--ops", default="", help="comma-separated op_db names (default: all)")
    c.add_argument("--sample", action="store_true",
                   help=f"the {len(CONFORMANCE_SAMPLE)} ops of conformance.SAMPLE (common ops of "
                        f"real models) instead of --ops")
    c.add_argument("--single-process", action="store_true",
                   help="every check in one child process, as PyTorch's CI runs test_ops.py: "
                        "state one check leaves is met by the next, and a crash ends the "
                        "run and fails it, naming the check that crashed")
    _common(c, timeout=300)
    torchtitan.add_arguments(sub.add_parser("torchtitan", help=torchtitan.HELP + " "
                                            "(docs/TORCHTITAN.md; scripts/torchtitan.sh)"))
    r = sub.add_parser("report", help="rewrite OUT/VALIDATION.md, the plot and the expected "
                                      "failures from the stored results")
    r.add_argument("--mode", choices=MODEL_MODES, default="strict")
    common.add_output_arguments(r, _WRITES, no_write=False)


def _common(p, timeout):
    p.add_argument("--shard", default="", metavar="I/N", help="run the I-th of N chunks")
    p.add_argument("--in-process", action="store_true",
                   help="run in this process (default: a child process that is restarted "
                        "after a crash, which then counts as the failure of its item)")
    p.add_argument("--timeout", type=float, default=timeout,
                   help=f"seconds per item (default {timeout})")
    common.add_output_arguments(p, _WRITES)


def _shard(items: list, spec: str) -> list:
    if not spec:
        return items
    i, n = (int(x) for x in spec.split("/"))
    if not 0 <= i < n:
        raise SystemExit(f"--shard {spec}: need 0 <= I < N")
    return items[i::n]


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="item", dynamic_ncols=True, file=sys.stderr)


def main(args) -> int:
    _env.quiet()
    import torch_tpu  # noqa: F401  (registers the device)

    return {"ops": _ops, "models": _models, "variants": _variants, "referee": _referee,
            "conformance": _conformance, "torchtitan": torchtitan.main,
            "report": _report}[args.what](args)


def _ops(args) -> int:
    from . import ops, report, worker

    dtypes = [d for d in args.dtype.split(",") if d]
    bad = [d for d in dtypes if d not in ops.DTYPES]
    if bad:
        raise SystemExit(f"unknown dtype(s) {bad}; choose from {list(ops.DTYPES)}")
    selected = _shard(ops.select([n for n in args.ops.split(",") if n]), args.shard)
    stored = report.load(args.out, "ops", args.mode)
    failed = None
    if args.rerun_failed:
        failed = {(n, d) for n, by in stored["results"].items() for d, r in by.items()
                  if r["status"] == "fail"}
        selected = [o for o in selected if any((ops.op_name(o), d) in failed for d in dtypes)]
    run = report.new_run()
    done = {}

    def on_result(name, dtype, r):
        done.setdefault(name, {})[dtype] = r
        if not args.no_write:
            report.merge(args.out, "ops", args.mode, {name: {dtype: r}}, run)

    units = [(ops.op_name(o), d) for o in selected for d in dtypes
             if failed is None or (ops.op_name(o), d) in failed]
    with _progress(len(units), f"validate ops ({args.mode})") as bar:
        if args.in_process:
            if failed is not None:
                raise SystemExit("--rerun-failed runs in a child process only")
            ops.sweep(selected, dtypes, args.mode, grad=not args.no_grad,
                      timeout=args.timeout, progress=bar, on_result=on_result)
        else:
            options = {"mode": args.mode, "grad": not args.no_grad, "timeout": args.timeout}
            worker.run_isolated("ops", units, options, lambda u, r: on_result(u[0], u[1], r),
                                bar, hard_timeout=2 * args.timeout + 120)
    print(_ops_brief(done, dtypes))
    if not args.no_write:
        _write_docs(args.out, args.mode)
    return 0


def _conformance(args) -> int:
    from . import conformance, ops, report, worker

    families = [f for f in args.families.split(",") if f] or list(conformance.FAMILIES)
    bad = [f for f in families if f not in conformance.FAMILIES]
    if bad:
        raise SystemExit(f"unknown famil(ies) {bad}; choose from {list(conformance.FAMILIES)}")
    names = list(conformance.SAMPLE) if args.sample else [n for n in args.ops.split(",") if n]
    selected = _shard(ops.select(names), args.shard)
    units = [(ops.op_name(o), f) for o in selected for f in families]
    run = report.new_run()
    failed = []

    def on_result(unit, r):
        if r["status"] == "fail":
            failed.append(f"  FAIL {unit[0]} {unit[1]}: {r.get('detail', '')[:160]}")
        if not args.no_write:
            report.merge(args.out, "conformance", args.mode, {unit[0]: {unit[1]: r}}, run)

    crashed = None
    with _progress(len(units), f"validate conformance ({args.mode})") as bar:
        if args.in_process:
            by_name = {ops.op_name(o): o for o in selected}
            for u in units:
                bar.set_postfix_str(f"{u[0]} {u[1]}", refresh=False)
                on_result(u, conformance.check(u[1], by_name[u[0]], args.mode))
                bar.update(1)
        else:
            crashed = worker.run_isolated("conformance", units, {"mode": args.mode}, on_result,
                                          bar, hard_timeout=args.timeout,
                                          restart=not args.single_process)
    print(f"this run: {len(units)} checks, {len(failed)} failed", *failed, sep="\n")
    if not args.no_write:
        report.write_conformance(args.out, CONFORMANCE_MODES)
    if crashed is not None:
        at = units.index(crashed)
        print(f"CRASHED: the process running every check died at check {at + 1} of "
              f"{len(units)}, {crashed[0]} {crashed[1]}; {len(units) - at - 1} did not run")
        return 1
    return 0


def _ops_brief(results, dtypes) -> str:
    from . import report

    s = report.ops_summary(results, dtypes)
    lines = [f"this run: {s['tpu_pass']}/{s['cpu_pairs']} op x dtype pairs that run on CPU pass "
             f"on tpu ({100 * s['rate']:.1f}%)"]
    for name, by in sorted(results.items()):
        for d, r in sorted(by.items()):
            if r["status"] == "fail":
                lines.append(f"  FAIL {name} {d}: {r.get('kind')}: {r.get('detail', '')[:160]}")
    return "\n".join(lines)


def _models(args) -> int:
    from . import models, report, worker

    types = models.model_types()
    if args.types:
        want = [t for t in args.types.split(",") if t]
        unknown = [t for t in want if t not in types]
        if unknown:
            raise SystemExit(f"unknown model type(s): {', '.join(unknown)}")
        types = {t: types[t] for t in want}
    keys = _shard(list(types), args.shard)
    if args.resume:
        stored = report.load(args.out, "models", args.mode)["results"]
        keys = [k for k in keys if stored.get(k, {}).get("harness") != models.HARNESS]
    types = {k: types[k] for k in keys}
    write = not (args.no_write or args.cpu_only)
    run = report.new_run()
    done = {}

    def on_result(mt, r):
        done[mt] = r
        from tqdm import tqdm

        tqdm.write(f"{mt}: {r['status']} {r.get('error', '')} {r.get('detail', '')[:140]}",
                   file=sys.stderr)
        if write:
            report.merge(args.out, "models", args.mode, {mt: r}, run)

    with _progress(len(types), f"validate models ({args.mode})") as bar:
        if args.in_process:
            models.sweep(types, args.mode, timeout=args.timeout, progress=bar,
                         on_result=on_result, cpu_only=args.cpu_only)
        else:
            options = {"mode": args.mode, "timeout": args.timeout, "cpu_only": args.cpu_only}
            worker.run_isolated("models", [(t, None) for t in types], options,
                                lambda u, r: on_result(u[0], {**_arch(types, u[0]),
                                                              "harness": models.HARNESS, **r}),
                                bar, hard_timeout=2 * args.timeout + 120)
    s = report.models_summary(done)
    print(f"this run: {s['types']} types, {s['cpu_ran']} run on CPU, {s['tpu_pass']} match on "
          f"tpu; " + ", ".join(f"{k} {n}" for k, n in s["status"].most_common()))
    if write:
        _write_docs(args.out, args.mode)
    return 0


def _variants(args) -> int:
    from . import models, report, variants, variants_report, worker

    types = models.model_types()
    want = [t for t in args.types.split(",") if t]
    picked = [v for v in args.variants.split(",") if v] or list(variants.VARIANTS)
    unknown = [t for t in want if t not in types] + \
        [v for v in picked if v not in variants.VARIANTS]
    if unknown:
        raise SystemExit(f"unknown model type(s) or variant(s): {', '.join(unknown)}")
    units = [u for u in variants.units({t: types[t] for t in want} if want else types)
             if u[1] in picked]
    units = _shard(units, args.shard)
    if args.resume:
        stored = report.load(args.out, "variants", args.mode)["results"]
        units = [u for u in units if u[1] not in stored.get(u[0], {})]
    run = report.new_run()
    done = {}

    def on_result(unit, r):
        r = {**_arch(types, unit[0]), "harness": models.HARNESS, **r}
        done[unit] = r
        if r["status"] not in ("pass", "unsupported"):
            from tqdm import tqdm

            tqdm.write(f"{unit[0]} {unit[1]}: {r['status']} {r.get('detail', '')[:140]}",
                       file=sys.stderr)
        if not args.no_write:
            report.merge(args.out, "variants", args.mode, {unit[0]: {unit[1]: r}}, run)

    with _progress(len(units), f"validate variants ({args.mode})") as bar:
        worker.run_isolated("variants", units, {"mode": args.mode, "timeout": args.timeout},
                            on_result, bar, hard_timeout=2 * args.timeout + 120)
    print("this run: " + variants_report.brief(list(done.values())))
    if not args.no_write:
        variants_report.write(args.out)
    return 0


def _referee(args) -> int:
    from . import referee, referee_report, report, worker

    names = [n for n in args.models.split(",") if n] or list(referee.MODELS)
    unknown = [n for n in names if n not in referee.MODELS]
    if unknown:
        raise SystemExit(f"not in the list: {', '.join(unknown)}")
    names = _shard(names, args.shard)
    if args.resume:
        stored = report.load(args.out, "referee", args.mode)["results"]
        names = [n for n in names if n not in stored]
    run = report.new_run()
    done = {}

    def on_result(unit, r):
        done[unit[0]] = r
        from tqdm import tqdm

        tqdm.write(f"{unit[0]}: {r['status']} {r.get('detail', '')[:140]}", file=sys.stderr)
        if not args.no_write:
            report.merge(args.out, "referee", args.mode, {unit[0]: r}, run)

    with _progress(len(names), f"validate referee ({args.mode})") as bar:
        worker.run_isolated("referee", [(n, None) for n in names],
                            {"mode": args.mode, "timeout": args.timeout}, on_result, bar,
                            hard_timeout=2 * args.timeout + 120)
    print("this run: " + referee_report.brief(done))
    if not args.no_write:
        referee_report.write(args.out)
    return 0


def _arch(types, mt) -> dict:
    task, cls_name = types[mt]
    return {"task": task, "arch": cls_name}


def _report(args) -> int:
    _write_docs(args.out, args.mode)
    return 0


def _write_docs(out, mode: str) -> None:
    """The reports of the stored results of `mode` in OUT, and the model zoo's every-mode
    table; in Strict mode also the plot. The expected failures (package data) are generated
    only when OUT is the default ./docs: a sweep written elsewhere must not rewrite them."""
    from . import models, ops, referee_report, report, zoo_report

    dtypes = list(ops.DTYPES)
    suffix = "" if mode == "strict" else f"-{mode}"
    o, m = report.load(out, "ops", mode), report.load(out, "models", mode)
    home = pathlib.Path(out).resolve() == pathlib.Path("docs").resolve()
    if o["results"]:
        report.write_docs(out, f"validate-ops{suffix}", f"OpInfo sweep ({mode})",
                          report.ops_markdown(o, dtypes, mode), o["meta"]["runs"])
        if mode == "strict" and home:
            report.write_expected("ops", o["results"])
    if m["results"]:
        report.write_docs(out, f"validate-models{suffix}", f"Model-zoo sweep ({mode})",
                          report.models_markdown(m, mode, models.timm_status()),
                          m["meta"]["runs"])
        zoo_report.write(out, expected_too=home)
    if mode == "strict":
        report.plot(out, o if o["results"] else None, m if m["results"] else None, dtypes)
    referee_report.write(out)  # (its plot sets the referee beside the zoo)
