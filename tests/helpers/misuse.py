"""The machinery of the misuse catalogue (tests/reliability/misuse_catalogue.py holds the cases).

A case is a small piece of user code written once for a device string. It runs with "tpu"
and is judged against one of:
- CPU: the same code with "cpu", run just before it in the same process;
- CUDA's documented behaviour, where CPU has no analogue (fork, OOM, device-side asserts,
  a CPU tensor next to a device tensor): an expectation written in the case, with the
  reason.

A case may set a different expectation for one mode (Debug's NaN check, say), with the
reason. The verdict compares the outcome: the exception (the tpu one must be an instance
of the expected class, so an `except` written for CPU catches it, and must carry the
case's message fragment when CPU's wording matters), or the returned value (dtype, shape,
device, and bit-exact values, or within _tolerances.BY_DTYPE for `close` cases). Then a
follow-up op must run and give the right value: the process survives, and the error left
nothing behind (no poisoned generator, no failed pending graph, no stuck mode).

All the cases of one mode run in one process (`python tests/reliability/misuse_catalogue.py --run
MODE`), which prints one `MISUSE-RESULT {json}` line per case; a case that needs a process
of its own (fork, a small memory limit) gets one. `collect(mode)` runs them and gathers
the lines; a case whose line never came is a failure that says how the process ended.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
ROOT = os.path.dirname(HERE)
MODES = ("strict", "debug", "defer_and_fuse")
_MODE_ENV = {"strict": {}, "debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"},
             "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"}}
MARK = "MISUSE-RESULT "
CASE_LIMIT_S = 60  # one case that hangs must not take the other cases' results with it
PROCESS_LIMIT_S = 300


# ---------------------------------------------------------------- expectations
@dataclasses.dataclass(frozen=True)
class Raises:
    """The code raises an instance of `exc` (a class, or the dotted name of one, resolved
    when the case runs), whose message contains `fragment` if given."""
    exc: object
    fragment: str | None = None

    def cls(self):
        if isinstance(self.exc, str):
            module, _, name = self.exc.rpartition(".")
            return getattr(__import__(module, fromlist=[name]), name)
        return self.exc

    def text(self) -> str:
        name = self.exc if isinstance(self.exc, str) else self.exc.__name__
        return f"raises {name.rpartition('.')[2]}" + (f" '{self.fragment}'" if self.fragment else "")


@dataclasses.dataclass(frozen=True)
class Returns:
    """The code returns this value (compared as a CPU result would be); `hosted`: the
    value is already host data (a CPU run's result)."""
    value: object
    hosted: bool = False

    def host(self):
        return self.value if self.hosted else _host(self.value, "tpu")

    def text(self) -> str:
        return "returns " + _short(self.host())


@dataclasses.dataclass(frozen=True)
class Survives:
    """The code raises nothing; its value is unspecified (as CUDA's would be)."""

    def text(self) -> str:
        return "no error, any value"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[str], object]
    item: str            # "1".."11": the item of issue 16 it covers; "" for the other misuse
    ref: str | None      # None: judged against CPU; else the behaviour judged against
    expect: object       # Raises | Returns | Survives, or None for "what CPU does"
    modes: dict          # mode -> (expectation, why) where one mode differs
    fragment: str | None  # part of CPU's message that the tpu message must carry
    close: bool          # values within _tolerances.BY_DTYPE instead of bit-exact
    env: dict | None     # run in a process of its own, with these variables set
    cpu_results: bool    # the code returns CPU tensors on either device (map_location="cpu")

    def expectation(self, mode):
        return self.modes[mode][0] if mode in self.modes else self.expect

    def judged(self, mode) -> str:
        if mode in self.modes:
            return self.modes[mode][1]
        return self.ref or "CPU"


CASES: dict[str, Case] = {}


def case(item="", ref=None, expect=None, modes=None, fragment=None, close=False, env=None,
         cpu_results=False):
    """Register the decorated function `name(dev)` as a case (see Case). `ref` names the
    behaviour judged against when it is not CPU's ("CUDA: ..."), and `expect` states it."""
    if (ref is None) != (expect is None):
        raise ValueError("a case judged against something other than CPU states it: ref= and expect=")

    def register(fn):
        if fn.__name__ in CASES:
            raise ValueError(f"duplicate misuse case {fn.__name__}")
        CASES[fn.__name__] = Case(fn.__name__, fn, str(item), ref, expect, modes or {},
                                  fragment, close, env, cpu_results)
        return fn
    return register


# ---------------------------------------------------------------- shared by the cases
NAN_CHECK = ("torch_tpu Debug: raises TpuNonFiniteError for a NaN made from finite "
             "inputs, by design (TORCH_TPU_DEBUG_NAN_CHECK=0 turns it off)")
DEBUG_NAN = {"debug": (Raises("torch_tpu.TpuNonFiniteError"), NAN_CHECK)}


def matrix(dev):
    """[[0, 1, 2], [3, 4, 5]] as float32 on `dev`."""
    import torch
    return torch.arange(6.0, device=dev).view(2, 3)


# ---------------------------------------------------------------- outcomes
def _host(v, dev):
    """A value as plain host data: tensors become ("tensor", device role, cpu copy)."""
    import numpy as np
    import torch
    if isinstance(v, torch.Tensor):
        role = "dev" if v.device.type == torch.device(dev).type else v.device.type
        return ("tensor", role, v.detach().to("cpu", copy=True))
    if isinstance(v, np.ndarray):
        return ("tensor", "numpy", torch.from_numpy(v.copy()))
    if isinstance(v, torch.Size):
        return tuple(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_host(x, dev) for x in v)
    if isinstance(v, dict):
        return {k: _host(x, dev) for k, x in v.items()}
    return v


def run_code(fn, dev, role_of=None):
    """("value", host value) or ("raises", exception): reading the value back is part of
    the code (it is a sync point: a deferred error belongs to the case that caused it).
    A tensor on the device `role_of` (default `dev`) is marked as on "dev"."""
    import torch
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "value", _host(fn(dev), role_of or dev)
    except BaseException as e:  # noqa: BLE001  (KeyboardInterrupt too: a case may leak one)
        return "raises", e


def _values_differ(a, b, close):
    import torch
    if isinstance(a, tuple) and a[:1] == ("tensor",):
        if not (isinstance(b, tuple) and b[:1] == ("tensor",)):
            return f"expected a tensor, got {_short(b)}"
        (_, ra, ta), (_, rb, tb) = a, b
        if ra != rb:
            return f"tensor on {rb}, expected on {ra}"
        if ta.dtype != tb.dtype or ta.shape != tb.shape:
            return f"{tb.dtype} {list(tb.shape)}, expected {ta.dtype} {list(ta.shape)}"
        if close and ta.is_floating_point():
            from torch_tpu._tolerances import BY_DTYPE
            rtol, atol = BY_DTYPE[ta.dtype]
            ok = torch.allclose(ta, tb, rtol=rtol, atol=atol, equal_nan=True)
        elif ta.is_floating_point() or ta.is_complex():
            # bit-exact, the sign of zero included; any NaN equals any NaN (its sign and
            # payload are not part of torch's contract)
            nan = ta.isnan()
            ok = torch.equal(nan, tb.isnan()) and torch.equal(ta[~nan], tb[~nan]) and torch.equal(
                torch.signbit(ta.real[~nan]), torch.signbit(tb.real[~nan]))
        else:
            ok = torch.equal(ta, tb)
        return None if ok else f"values {_short(b)}, expected {_short(a)}"
    if isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{_short(b)}, expected {_short(a)}"
        for x, y in zip(a, b):
            why = _values_differ(x, y, close)
            if why:
                return why
        return None
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return f"{_short(b)}, expected {_short(a)}"
        return next((w for k in a if (w := _values_differ(a[k], b[k], close))), None)
    if isinstance(a, float) and isinstance(b, float):
        if close:  # a float32 tensor's .item(): the tolerances of its tensors
            from torch_tpu._tolerances import BY_DTYPE
            rtol, atol = BY_DTYPE[torch.float32]
        same = (math.isnan(a) and math.isnan(b)) or (
            math.isclose(a, b, rel_tol=rtol, abs_tol=atol) if close else a == b)
        return None if same else f"{b!r}, expected {a!r}"
    return None if (type(a) is type(b) and a == b) else f"{_short(b)}, expected {_short(a)}"


def judge(expectation, observed, close) -> str | None:
    """None when the observed outcome meets the expectation, else why not."""
    kind, got = observed
    if isinstance(expectation, Raises):
        cls = expectation.cls()
        if kind != "raises":
            return f"returned {_short(got)}: expected {cls.__name__}"
        if not isinstance(got, cls):
            return f"raised {type(got).__name__} (not a {cls.__name__}): {_msg(got)}"
        if expectation.fragment and expectation.fragment not in str(got):
            return f"message lacks '{expectation.fragment}': {_msg(got)}"
        return None
    if kind == "raises":
        return f"raised {type(got).__name__}: {_msg(got)}"
    if isinstance(expectation, Survives):
        return None
    return _values_differ(expectation.host(), got, close)


def expectation_from_cpu(c: Case):
    """What CPU does with the case's code, as an expectation."""
    kind, got = run_code(c.fn, "cpu", "tpu" if c.cpu_results else "cpu")
    if kind == "raises":
        if c.fragment and c.fragment not in str(got):
            raise AssertionError(f"case {c.name}: CPU's message lacks '{c.fragment}': {got}")
        return Raises(type(got), c.fragment), f"{type(got).__name__}: {_msg(got, 60)}"
    return Returns(got, hosted=True), _short(got)


# ---------------------------------------------------------------- texts
def _msg(e, n=110) -> str:
    text = " ".join(str(e).split())
    text = re.sub(r"(/[\w.-]+)+/([\w.-]+\.py)", r"\2", text)  # no machine paths
    text = re.sub(r"0x[0-9a-f]{6,}", "0x…", text)
    return text if len(text) <= n else text[: n - 1] + "…"


def _short(v, n=70) -> str:
    import torch
    if isinstance(v, tuple) and v[:1] == ("tensor",):
        t = v[2]
        vals = t.flatten()[:4].tolist()
        body = ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in vals)
        more = ", …" if t.numel() > 4 else ""
        dt = str(t.dtype).replace("torch.", "")
        where = "" if v[1] == "dev" else f" on {v[1]}"
        text = f"{dt}{list(t.shape)}{where} [{body}{more}]"
    elif isinstance(v, (list, tuple)):
        text = "(" + ", ".join(_short(x, n) for x in v) + ")"
    elif isinstance(v, torch.dtype):
        text = str(v)
    else:
        text = repr(v)
    return text if len(text) <= n else text[: n - 1] + "…"


def _outcome_text(observed) -> str:
    kind, got = observed
    return f"{type(got).__name__}: {_msg(got, 60)}" if kind == "raises" else _short(got)


# ---------------------------------------------------------------- in the case process
def _follow_up(mode):
    """A plain op after the case: it must run, give the right value, in the right mode."""
    import torch

    import torch_tpu
    x = torch.arange(4.0, device="tpu")
    r = torch.rand(2, device="tpu")
    v = (x * 2).sum().item()
    torch.tpu.synchronize()
    if v != 12.0 or r.shape != (2,) or not bool(((r >= 0) & (r < 1)).all()):
        raise AssertionError(f"follow-up op gave {v}, rand {r.cpu().tolist()}")
    now = torch_tpu.get_eager_mode().value
    if now != mode:
        raise AssertionError(f"the eager mode is now {now}")


class _CaseTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CaseTimeout(f"the case ran past {CASE_LIMIT_S} s")


def run_in_process(mode, names):
    """Run the named cases in this process, printing one result line each."""
    import torch_tpu  # noqa: F401  (the device)
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        c = CASES[name]
        t0 = time.monotonic()
        signal.alarm(CASE_LIMIT_S)
        try:
            if c.expectation(mode) is None:
                expectation, expected = expectation_from_cpu(c)
            else:
                expectation = c.expectation(mode)
                expected = expectation.text()
            observed = run_code(c.fn, "tpu")
            why = judge(expectation, observed, c.close)
            try:
                _follow_up(mode)
            except BaseException as e:  # noqa: BLE001  (whatever it is, the case failed)
                why = (why + "; " if why else "") + f"follow-up failed: {type(e).__name__}: {_msg(e)}"
            observed_text = _outcome_text(observed)
        except BaseException as e:  # noqa: BLE001  (the machinery or the alarm: still one line)
            expected, observed_text = "?", f"{type(e).__name__}: {_msg(e)}"
            why = f"the case did not complete: {observed_text}"
        finally:
            signal.alarm(0)
        line = {"case": name, "mode": mode, "item": c.item, "judged": c.judged(mode),
                "expected": expected, "observed": observed_text,
                "verdict": "fail" if why else "pass", "why": why or "",
                "seconds": round(time.monotonic() - t0, 2)}
        print(MARK + json.dumps(line), flush=True)


# ---------------------------------------------------------------- in the parent
def _env(mode, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    keep = ("TORCH_TPU_CACHE_DIR", "TORCH_TPU_PLATFORM")  # where the machine says so
    env.update({k: os.environ[k] for k in keep if k in os.environ})
    env.update(_MODE_ENV[mode], PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + HERE
    env.update(extra or {})
    return env


def _start(script, mode, names, extra):
    cmd = [sys.executable, script, "--run", mode] + [a for n in names for a in ("--case", n)]
    return subprocess.Popen(cmd, env=_env(mode, extra), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc, names, mode, deadline):
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        ended = f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        ended = f"killed after {PROCESS_LIMIT_S} s"
    results = {}
    for line in out.splitlines():
        if line.startswith(MARK):
            r = json.loads(line[len(MARK):])
            results[r["case"]] = r
    tail = " | ".join(err.strip().splitlines()[-3:])[-300:]
    for name in names:
        if name not in results:
            c = CASES[name]
            results[name] = {"case": name, "mode": mode, "item": c.item,
                             "judged": c.judged(mode), "expected": "?", "observed": "no result",
                             "verdict": "fail", "seconds": 0.0,
                             "why": f"no result line: the process ended ({ended}): {tail}"}
    return results


def collect(mode, script, names=None):
    """Run the cases (all by default) in `mode`: the shared ones in one process, and the
    cases that need a process of their own in one process per distinct `env` (the fork
    cases share one), all at once. Returns {case: result} and the wall time."""
    names = list(CASES) if names is None else list(names)
    t0 = time.monotonic()
    groups = {}
    for n in names:
        env = CASES[n].env
        groups.setdefault(None if env is None else tuple(sorted(env.items())), []).append(n)
    procs = [(_start(script, mode, batch, dict(key or ())), batch) for key, batch in groups.items()]
    results = {}
    for proc, batch in procs:
        results.update(_finish(proc, batch, mode, t0 + PROCESS_LIMIT_S))
    return {n: results[n] for n in names}, time.monotonic() - t0


# ---------------------------------------------------------------- the document
TABLE_BEGIN = "<!-- misuse-table:begin (python tests/reliability/misuse_catalogue.py --write) -->"
TABLE_END = "<!-- misuse-table:end -->"


def table(results_by_mode, pending) -> str:
    """The markdown table, one row per case and mode, under a line that counts them."""
    verdicts = [(results_by_mode[m][n]["verdict"], bool(pending_reason(pending, n, m)))
                for n in CASES for m in MODES]
    summary = (f"{len(CASES)} cases in {len(MODES)} modes: {verdicts.count(('pass', False))} "
               f"pass, {verdicts.count(('fail', True))} pending, "
               f"{verdicts.count(('fail', False))} fail, "
               f"{verdicts.count(('pass', True))} pass while still pending.")
    rows = [summary, "",
            "| case | item | mode | judged against | expected | observed | verdict |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in CASES:
        for mode in MODES:
            r = results_by_mode[mode][name]
            verdict = r["verdict"]
            p = pending_reason(pending, name, mode)
            if p:
                verdict += f" (pending: {p})"
            cells = [f"`{name}`", r["item"] or "-", mode, r["judged"], r["expected"],
                     r["observed"], verdict]
            rows.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(rows)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def pending_reason(pending, name, mode):
    """PENDING holds `case` (every mode) or `case@mode` (that mode only)."""
    return pending.get(f"{name}@{mode}") or pending.get(name)


def write_doc(results, pending) -> None:
    """Replace the table between the markers of docs/RELIABILITY.md (the rest is prose)."""
    path = os.path.join(ROOT, "docs", "RELIABILITY.md")
    with open(path) as f:
        text = f.read()
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END)
    with open(path, "w") as f:
        f.write(text[: begin + len(TABLE_BEGIN)] + "\n" + table(results, pending) + "\n" + text[end:])


# ---------------------------------------------------------------- command line
def main(argv, script, pending) -> int:
    """tests/reliability/misuse_catalogue.py's command line (see its docstring)."""
    import argparse
    p = argparse.ArgumentParser(description="the misuse catalogue of issue 16")
    p.add_argument("--run", choices=MODES, help="(internal) run cases in this process")
    p.add_argument("--case", action="append", help="only this case (repeatable)")
    p.add_argument("--mode", action="append", choices=MODES, help="only this mode (repeatable)")
    p.add_argument("--write", action="store_true", help="regenerate docs/RELIABILITY.md")
    args = p.parse_args(argv)
    if args.run:
        run_in_process(args.run, args.case or [n for n in CASES if CASES[n].env is None])
        return 0
    if args.write and (args.case or args.mode):
        p.error("--write runs every case in every mode")
    import resource
    results, failed = {}, 0
    for mode in args.mode or MODES:
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        results[mode], seconds = collect(mode, script, args.case)
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
        for r in results[mode].values():
            pend = pending_reason(pending, r["case"], mode)
            ok = (r["verdict"] == "pass") != bool(pend)
            failed += not ok
            if not ok or args.case:
                tag = ("PASSES: remove it from PENDING" if pend and r["verdict"] == "pass"
                       else r["verdict"] + (" (pending)" if pend else ""))
                print(f"{mode:15s} {r['case']:45s} {tag}: {r['why']}")
        print(f"{mode}: {len(results[mode])} cases in {seconds:.1f} s ({cpu:.1f} s of CPU)")
    if args.write:
        write_doc(results, pending)
    return 1 if failed else 0
