"""The executor interface is total: every mode answers the same calls (eager/current.py), so
nothing outside the executors asks which mode it is in."""
import ast
import pathlib

import pytest
import torch

import torch_tpu
from torch_tpu import metrics
from torch_tpu.eager import current, modes

INTERFACE = ("execute", "flush", "constant", "fill", "upload", "backward")
MODES = ["strict", "debug", "defer_and_fuse"]


@pytest.mark.parametrize("mode", MODES)
def test_every_executor_answers_the_whole_interface(mode):
    ex = modes._executor_for(modes._coerce(mode))
    for name in INTERFACE:
        assert callable(getattr(ex, name)), (mode, name)


def test_no_caller_outside_the_executors_asks_for_the_mode():
    root = pathlib.Path(torch_tpu.__file__).parent
    owners = {"eager/strict.py", "eager/debug.py", "eager/defer.py", "eager/modes.py"}
    askers = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel in owners:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "deferred":
                askers.append(f"{rel}:{node.lineno}")
    assert not askers, f"callers test the mode instead of asking the executor: {askers}"


@pytest.mark.parametrize("mode", MODES)
def test_fills_uploads_and_flushes_through_the_executor(mode):
    with torch_tpu.eager_mode(mode):
        before = metrics.counters.copy()
        z = torch.zeros(3, 4, device="tpu")          # empty + a whole-storage fill_
        o = torch.full((3, 4), 2.5, device="tpu")
        h = torch.arange(12.0).reshape(3, 4).to("tpu")  # a host upload
        current.flush_pending("test")                 # a no-op outside DeferAndFuse
        with current.backward_pass():
            s = (z + o * h).sum()
        assert s.item() == pytest.approx(2.5 * 66)
        grew = metrics.counters - before
    counter = {"strict": "dispatches.strict", "debug": "dispatches.debug",
               "defer_and_fuse": "dispatches.defer_and_fuse"}[mode]
    assert grew[counter] >= 5, dict(grew)  # the two fills count as ops of the mode
    assert grew["host_to_device"] >= 1


def test_debug_counts_whole_storage_fills_as_its_ops():
    with torch_tpu.eager_mode("debug"):
        before = metrics.counters["dispatches.debug"]
        torch.ones(2, device="tpu")
        assert metrics.counters["dispatches.debug"] == before + 1
