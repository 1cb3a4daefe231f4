"""Work whose shapes or offsets change, counted in programs compiled (stable, unlike times).

Each test runs a user's script in a subprocess, as written for CUDA with only the device
string swapped, beside the same script on CPU for the reference numbers."""
import pathlib

import pytest
import torch

from helpers.dist_launch import run_script, swap_cuda

SCRIPTS = pathlib.Path(__file__).parents[1] / "user_code"
MODES = {
    "strict": {},
    "debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"},
    "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"},
    "compile": {"COMPILE": "1", "BACKEND": "tpu"},
}


def _run(script, env):
    code, out, results = run_script(script, env=env, timeout=400)
    assert code == 0 and results, out[-4000:]
    return results[0]


@pytest.fixture(scope="module")
def bptt_cpu():
    return _run(SCRIPTS / "lm_bptt.py", {"FORCE_CPU": "1"})


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sliced_batches_compile_nothing_after_warmup(mode, bptt_cpu, tmp_path):
    """`source[i:i + bptt]` at every i is one program: a view's offset is data, not part
    of the program's key. Every mode is warm after the first batch (DeferAndFuse flushes
    at the optimizer step's end, so its graphs begin where the iterations do)."""
    got = _run(swap_cuda(SCRIPTS / "lm_bptt.py", tmp_path / "lm_bptt_tpu.py"), MODES[mode])
    assert got["programs"][1:] == [got["programs"][0]] * (len(got["programs"]) - 1), got
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(bptt_cpu["losses"]),
                               rtol=1e-5, atol=1e-5)
