"""Sweep units run in a child process, so that a unit that kills the interpreter (a
segfault in a kernel, the kernel's OOM killer, an XLA compile that never returns) costs only
itself: the parent records it as a crash and starts a new child on the units after it.

A unit is (name, dtype) for the OpInfo sweep, (name, family) for the conformance sweep,
(model type, None) for the model sweep, (model type, variant) for the variants and
(name, None) for the referee's list. The child
appends one JSON line per event to a file the parent tails: {"start": unit} before a unit
and {"unit": unit, "result": {...}} after it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from . import _env


def run_isolated(kind: str, units: list, options: dict, on_result, progress=None,
                 hard_timeout: float | None = None, restart: bool = True) -> tuple | None:
    """Run every unit of `units` in children; call on_result(unit, result) for each.
    With `restart` False all run in one child, as PyTorch's CI runs a test file: a unit
    that takes it down ends the run, and is returned (None when none did)."""
    remaining = [tuple(u) for u in units]
    while remaining:
        remaining, crashed = _one_child(kind, remaining, options, on_result, progress,
                                        hard_timeout)
        if crashed is not None and not restart:
            return crashed
    return None


def _one_child(kind, units, options, on_result, progress, hard_timeout) -> tuple:
    """-> (the units it did not finish, the unit it died in or None)."""
    with tempfile.TemporaryDirectory(prefix="torch_tpu_validate_") as tmp:
        spec, log = os.path.join(tmp, "spec.json"), os.path.join(tmp, "events.jsonl")
        with open(spec, "w") as f:
            json.dump({"kind": kind, "units": units, "options": options}, f)
        open(log, "w").close()
        proc = subprocess.Popen([sys.executable, "-m", "torch_tpu_tools.validation.worker", spec, log],
                                stdout=subprocess.DEVNULL, stderr=sys.stderr)
        done, current, started_at, pos, phase = set(), None, None, 0, "cpu"
        while True:
            rc = proc.poll()
            with open(log) as f:
                f.seek(pos)
                chunk = f.read()
            # only whole lines: the child may be halfway through writing one
            complete = chunk[:chunk.rfind("\n") + 1]
            pos += len(complete.encode())
            for line in complete.splitlines():
                ev = json.loads(line)
                if "start" in ev:
                    current, started_at = tuple(ev["start"]), time.monotonic()
                    phase = "cpu"
                elif "phase" in ev:
                    phase = ev["phase"]
                else:
                    unit = tuple(ev["unit"])
                    done.add(unit)
                    current = None
                    on_result(unit, ev["result"])
                    if progress is not None:
                        progress.update(1)
            if rc is not None and not complete:
                break
            if (hard_timeout and current is not None and
                    time.monotonic() - started_at > hard_timeout):
                proc.kill()
                proc.wait()
                _crash(current, f"killed after {hard_timeout:.0f} s without finishing",
                       "timeout", phase, on_result, progress, done)
                return [u for u in units if u not in done], current
            if rc is None:
                time.sleep(0.3)
        crashed = current
        if current is not None:
            how = (f"signal {-rc}" if rc < 0 else f"exit status {rc}")
            _crash(current, f"the process died ({how})", "crash", phase, on_result, progress,
                   done)
        elif rc != 0 and len(done) < len(units):
            # died before its first unit: an import error, say; nothing would get further
            for u in units:
                if u not in done:
                    _crash(u, f"worker failed to start (exit status {rc})", "crash", "cpu",
                           on_result, progress, done)
        return [u for u in units if u not in done], crashed


def _crash(unit, detail, kind, phase, on_result, progress, done) -> None:
    """Record a unit that took its process down. A model that died before its tpu run
    is a harness failure on CPU, never counted against tpu."""
    done.add(unit)
    name = "Timeout" if kind == "timeout" else "Crash"
    if unit[1] is not None:
        status = "fail"
    else:
        status = kind if phase == "tpu" else "cpu_fail"
    on_result(unit, {"status": status, "kind": kind, "error": name,
                     "detail": f"{detail} during the {phase} run"})
    if progress is not None:
        progress.update(1)


# ---------------------------------------------------------------- the child
def _child(spec_path: str, log_path: str) -> int:
    _env.quiet()
    import torch_tpu  # noqa: F401

    with open(spec_path) as f:
        spec = json.load(f)
    opts = spec["options"]
    kind = spec["kind"]
    if kind == "ops":
        from . import ops

        by_name = {ops.op_name(o): o for o in ops.op_db()}

        def run(unit):
            return ops.check_pair(by_name[unit[0]], unit[1], opts["mode"], opts["grad"],
                                  opts["timeout"], opts.get("max_samples"))
    elif kind == "conformance":
        from . import conformance, ops

        by_name = {ops.op_name(o): o for o in ops.op_db()}

        def run(unit):
            return conformance.check(unit[1], by_name[unit[0]], opts["mode"])
    elif kind == "referee":
        from . import referee

        def run(unit):
            return referee.check(unit[0], opts["mode"], opts["timeout"], on_tpu=on_tpu)
    else:
        from . import models

        types = models.model_types()

        def run(unit):
            task, cls_name = types[unit[0]]
            return models.check_model(unit[0], task, cls_name, opts["mode"], opts["timeout"],
                                      opts.get("cpu_only", False), on_tpu=on_tpu,
                                      variant=unit[1] if kind == "variants" else None)
    parent = os.getppid()
    log = open(log_path, "a")

    def on_tpu():  # the parent counts a crash from here on against tpu
        log.write(json.dumps({"phase": "tpu"}) + "\n")
        log.flush()
    with log:
        for unit in spec["units"]:
            if os.getppid() != parent:
                return 1  # the sweep that started us is gone: nobody reads the results
            log.write(json.dumps({"start": unit}) + "\n")
            log.flush()
            result = run(unit)
            log.write(json.dumps({"unit": unit, "result": result}) + "\n")
            log.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
