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
    """Strict runs with HF's collators unpatched (TORCH_TPU_BUCKETED_COLLATORS=0), so
    Trainer's loaders do the padding and the script's collator sees CPU's lengths;
    DeferAndFuse runs as installed, where `DataCollatorWithPadding` itself pads to the
    bucket (collators.py), and the script sees the buckets of CPU's lengths."""
    from torch_tpu._buckets import bucket

    if mode == "strict":
        env, want = {"TORCH_TPU_BUCKETED_COLLATORS": "0"}, cpu["lengths"]
    else:
        env = {"TORCH_TPU_DEFER_AND_FUSE": "1"}
        want = [sorted({bucket(n) for n in epoch}) for epoch in cpu["lengths"]]
    got = _run(env)
    assert got["device"].startswith("tpu") and got["lengths"] == want, got
    first, second = got["programs"]
    assert first > 0 and second == first, got["programs"]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(cpu["losses"]),
                               rtol=1e-4, atol=1e-4)



# ---------------------------------------------------------------- a plain loop
PLAIN = pathlib.Path(__file__).parents[1] / "user_code" / "plain_loop_padding.py"


@pytest.fixture(scope="module", params=["padding", "mlm"])
def plain_cpu(request):
    """The plain loop on the CPU, torch_tpu installed (autoloaded) but the device unused:
    the collators pad as they always do."""
    code, out, results = run_script(PLAIN, env={**QUIET, "FORCE_CPU": "1",
                                                "COLLATOR": request.param}, timeout=300)
    assert code == 0 and results, out[-4000:]
    got = results[0]
    assert len(set(got["lengths"])) >= 15 and max(got["lengths"]) <= 128, got
    return request.param, got


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_plain_loop_over_hf_collators_builds_nothing_in_its_second_epoch(mode, plain_cpu, tmp_path):
    """`DataLoader(collate_fn=DataCollatorWithPadding(tokenizer))` or the masked-LM collator
    in the user's own loop, the script written for CUDA: once the process uses tpu, the
    collators pad each batch to its bucket (torch_tpu/_integrations/collators.py), so a
    step whose bucket came before builds no program; the losses equal the CPU run's,
    unpadded."""
    from helpers.dist_launch import swap_cuda

    collator, cpu = plain_cpu
    env = {**QUIET, "COLLATOR": collator,
           **({"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "defer_and_fuse" else {})}
    code, out, results = run_script(swap_cuda(PLAIN, tmp_path / "plain_tpu.py"), env=env,
                                    timeout=400)
    assert code == 0 and results, out[-4000:]
    got = results[0]
    buckets = got["lengths"]
    assert set(buckets) <= {16, 32, 64, 128} and len(set(buckets)) >= 2, buckets
    # a bucket met before builds nothing; DeferAndFuse's exception: AdamW makes its state
    # in its first step, so the first bucket's second step compiles once more
    built = [b - a for a, b in zip([0] + got["programs"], got["programs"])]
    exempt = buckets.index(buckets[0], 1) if mode == "defer_and_fuse" else None
    repeats = [(i, n, built[i]) for i, n in enumerate(buckets) if n in buckets[:i] and i != exempt]
    assert len(repeats) >= 12 and all(p == 0 for _, _, p in repeats), repeats
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(cpu["losses"]),
                               rtol=1e-4, atol=1e-4)
