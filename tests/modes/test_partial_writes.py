"""Writes into part of a large buffer (tests/user_code/partial_writes.py, written for CUDA:
TRL's chunked log-prob corner, slice assignment, a ring buffer, an integer buffer, and the
aliasing a write must respect). Strict donates a buffer that only its storage holds to
such a write, so XLA updates it in place (eager/strict.py `write_in_place`); DeferAndFuse
reads a view a write in the same graph made as the written value (eager/forward.py). The
values are CPU's in every mode, and a clone, a host copy and a live view see what torch
says."""
import pathlib

import pytest
from helpers.dist_launch import run_script, swap_cuda

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "partial_writes.py"
MODES = {"strict": {}, "debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"},
         "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"}}
STEPS = 4
# per step: the corner (mm out=) and the two slice writes into the 5 MB buffer, 7 of the 8
# ring rows, the integer buffer; not the copy from the buffer's own view (a write that
# reads its buffer) nor the first ring row (torch.zeros of 1.3 MB is a shared fill)
IN_PLACE_PER_STEP = 11


def _run(script, env):
    code, out, res = run_script(script, env={"STEPS": str(STEPS), **env}, timeout=300)
    assert code == 0 and res, out[-4000:]
    return res[0]


def _close(a, b):
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


@pytest.mark.parametrize("mode", list(MODES))
def test_partial_writes_match_cpu(mode, tmp_path):
    want = _run(SCRIPT, {"FORCE_CPU": "1"})
    got = _run(swap_cuda(SCRIPT, tmp_path / "partial_writes_tpu.py"), MODES[mode])
    assert _close(got["steps"], want["steps"]), (got["steps"], want["steps"])
    counts = got["counts"]
    if mode == "strict":  # (the first step's writes run in its compile window)
        assert counts["writes_in_place"] == IN_PLACE_PER_STEP * (STEPS - 1), counts
    else:
        assert counts["writes_in_place"] == 0, counts
    # DeferAndFuse: the corner read back after its write, in the graph the `.item()` runs
    assert (counts["fused_forwarded_reads"] >= STEPS) == (mode == "defer_and_fuse"), counts
