"""The executor interface is total: every mode answers the same calls (op/current.py), so
nothing outside the executors asks which mode it is in."""
import ast
import pathlib

import pytest
import torch

import torch_tpu
from torch_tpu import metrics
from torch_tpu.eager import modes
from torch_tpu.op import current

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
    # the two fills count as ops of the mode; in Strict a fill that finds its constant
    # made before (_storage.shared) runs no XLA call and counts as fills.shared instead
    fills = grew["fills.shared"] if mode == "strict" else 0
    assert grew[counter] + fills >= 5, dict(grew)
    assert grew["host_to_device"] >= 1


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_small_integer_uploads_share_a_buffer_and_writes_stay_apart(mode):
    """Index lists upload once per value (_storage.small_upload): two tensors of the same
    values share one buffer, and a write to either (in place, a slice, an out=) changes
    that tensor only, as two CUDA tensors would."""
    with torch_tpu.eager_mode(mode):
        a = torch.tensor([4, 0, 2], device="tpu")
        b = torch.tensor([4, 0, 2]).to("tpu")
        c = torch.tensor([4, 0, 2], dtype=torch.int32, device="tpu")
        assert a.untyped_storage()._xla[0] is b.untyped_storage()._xla[0]
        assert c.untyped_storage()._xla[0] is not a.untyped_storage()._xla[0]
        a.add_(1)
        b[1] = 7
        torch.mul(c, 2, out=c)
        d = torch.tensor([4, 0, 2], device="tpu")
        x = torch.arange(10.0, device="tpu")
        got = [a.tolist(), b.tolist(), c.tolist(), d.tolist(), x[[4, 0, 2]].tolist(),
               x[:, None][[4, 0, 2], 0].tolist()]
    assert got == [[5, 1, 3], [4, 7, 2], [8, 0, 4], [4, 0, 2], [4.0, 0.0, 2.0], [4.0, 0.0, 2.0]]


def test_strict_fill_of_a_constant_made_before_runs_no_xla_call():
    """torch.zeros/ones_like in Strict: the first makes the constant (one XLA call, an
    op); the next ones of the same size, dtype and value share its immutable buffer, and
    every result still reads its own values after an in-place write to one of them."""
    with torch_tpu.eager_mode("strict"):
        before = metrics.counters.copy()
        a = torch.full((5, 7), -3.3671875, device="tpu")
        made = metrics.counters - before
        b, c = torch.full_like(a, -3.3671875), torch.full((35,), -3.3671875, device="tpu")
        shared = metrics.counters - before - made
        b.add_(1)
        assert made["dispatches.strict"] == 1 and not made["fills.shared"], dict(made)
        assert shared["fills.shared"] == 2 and not shared["dispatches.strict"], dict(shared)
        assert (a.cpu() == -3.3671875).all() and (c.cpu() == -3.3671875).all()
        assert (b.cpu() == -2.3671875).all()
        n = metrics.counters["fills.shared"]
        assert (torch.full((5, 7), 3.3671875, device="tpu").cpu() == 3.3671875).all()
        assert metrics.counters["fills.shared"] == n  # another value: its own constant


def test_debug_counts_whole_storage_fills_as_its_ops():
    with torch_tpu.eager_mode("debug"):
        before = metrics.counters["dispatches.debug"]
        torch.ones(2, device="tpu")
        assert metrics.counters["dispatches.debug"] == before + 1
