"""HF Trainer with dynamic padding (`DataCollatorWithPadding`, HF's default whenever a
tokenizer is given) on tpu: the script (tests/user_code/trainer_dynamic_padding.py) names no
device and pads nothing itself. Its batches come in 15+ lengths; on tpu, Trainer's loaders
pad each to its bucket (torch_tpu/_integrations/trainer.py), so the first epoch builds a
program set per bucket and the second builds none, in Strict and DeferAndFuse; the losses
equal the same script's on the CPU, where nothing is padded. (TORCH_TPU_BUCKETED_TRAINER=0
turns it off: then the second epoch's new lengths compile again.)"""
import pathlib

import pytest
import torch

from helpers.dist_launch import run_script

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "trainer_dynamic_padding.py"
QUIET = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TORCH_TPU_RECOMPILE_WARN": "0"}
pytestmark = pytest.mark.slow  # three Trainer runs of 24 steps, each in a fresh process


def _run(env):
    code, out, results = run_script(SCRIPT, env={**QUIET, **env}, timeout=500)
    assert code == 0 and results, out[-4000:]
    return results[0]


@pytest.fixture(scope="module")
def cpu():
    got = _run({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "ACCELERATE_USE_CPU": "1"})
    first, second = map(set, got["lengths"])
    assert got["device"] == "cpu" and len(first | second) >= 15, got
    assert second - first, got  # the second epoch meets lengths the first did not
    return got


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_second_epoch_builds_no_program_and_losses_match_cpu(mode, cpu):
    env = {"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "defer_and_fuse" else {}
    got = _run(env)
    assert got["device"].startswith("tpu") and got["lengths"] == cpu["lengths"], got
    first, second = got["programs"]
    assert first > 0 and second == first, got["programs"]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(cpu["losses"]),
                               rtol=1e-4, atol=1e-4)

