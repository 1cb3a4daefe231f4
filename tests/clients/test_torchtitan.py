"""torchtitan, unmodified, as a client: a short version of `python -m torch_tpu validate
torchtitan` (torch_tpu_tools/validation/torchtitan.py): 0.2.2 in one process and with
FSDP=2, 0.3.0 in one process, a few small steps each, every loss against the same run on
the CPU (gloo) from the same seed checkpoint.

Marked `torchtitan`: scripts/test.sh (and so CI) leaves it out; `bash scripts/torchtitan.sh
--test` sets up .venv-torchtitan and runs it. Without that environment it skips, naming the
command that sets it up.
"""
import pathlib

import pytest

from torch_tpu_tools.validation import torchtitan

pytestmark = [pytest.mark.torchtitan, pytest.mark.slow, pytest.mark.distributed]

SHAPE = torchtitan.Shape(steps=4, seq_len=256, batch=2)
ENV = pathlib.Path(__file__).resolve().parents[2] / ".venv-torchtitan"


@pytest.fixture(scope="module")
def results():
    reason = torchtitan.missing({torchtitan.CONFIGS[k].version for k in torchtitan.QUICK}, ENV)
    if reason:
        pytest.skip(reason)
    return torchtitan.run(torchtitan.QUICK, SHAPE, ENV, timeout=1200)


@pytest.mark.parametrize("key", torchtitan.QUICK)
def test_loss_parity_with_cpu(results, key):
    r = results[key]
    assert not r["cpu_error"], f"the CPU baseline failed: {r['cpu_error']} ({r['logs'][0]})"
    assert not r["tpu_error"], f"tpu failed: {r['tpu_error']} ({r['logs'][1]})"
    assert r["steps"] == SHAPE.steps, r
    assert r["max_diff"] <= torchtitan.TOLERANCE, (
        f"{key}: losses differ by {r['max_diff']:.2e}: CPU {r['cpu_losses']}, "
        f"tpu {r['tpu_losses']}")
