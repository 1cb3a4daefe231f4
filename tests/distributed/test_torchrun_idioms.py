"""Device indexing under torchrun, as CUDA scripts and TorchTPU scripts use it.

A CUDA-style DDP script (tests/user_code/ddp_cuda_style.py) is run with only "cuda" -> "tpu"
and "nccl" -> "tpu_dist" changed; a TorchTPU-style one (everything on tpu:0) in the same
test run. Both must train with the losses of the same script on CPU over gloo."""
import os
import pathlib
import subprocess
import sys

import pytest

from helpers.dist_launch import run_script, swap_cuda


SCRIPTS = pathlib.Path(__file__).parents[1] / "user_code"


def _torchrun(script, env=None, nproc=2, timeout=300):
    code, out, results = run_script(script, env, nproc, timeout)
    return subprocess.CompletedProcess([str(script)], code, out, ""), results


def _swapped(tmp_path, name):
    return swap_cuda(SCRIPTS / name, tmp_path / name)


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory):
    out, results = _torchrun(SCRIPTS / "ddp_cuda_style.py", {"FORCE_CPU": "1"})
    assert out.returncode == 0 and len(results) == 2, out.stdout + out.stderr
    return results


@pytest.mark.parametrize("set_device_api", ["torch.tpu", "accelerator"])
def test_cuda_style_ddp_script_with_two_strings_changed(tmp_path, cpu_reference, set_device_api):
    script = _swapped(tmp_path, "ddp_cuda_style.py")
    env = {"SET_DEVICE_API": "accelerator"} if set_device_api == "accelerator" else {}
    out, results = _torchrun(script, env)
    log = out.stdout + out.stderr
    assert "not enough devices" not in log, log
    assert out.returncode == 0 and len(results) == 2, log
    for rank, (got, want) in enumerate(zip(results, cpu_reference)):
        assert got["device"] == f"tpu:{rank}" and got["current"] == rank, got
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5), (got, want)
        assert got["params"] == pytest.approx(want["params"], abs=1e-4)
    assert results[0]["params"] == pytest.approx(results[1]["params"], abs=1e-6)  # in sync


def test_torchtpu_style_script_everything_on_tpu0(tmp_path, cpu_reference):
    out, results = _torchrun(SCRIPTS / "ddp_torchtpu_style.py")
    assert out.returncode == 0 and len(results) == 2, out.stdout + out.stderr
    ref, ref_results = _torchrun(SCRIPTS / "ddp_torchtpu_style.py", {"FORCE_CPU": "1"})
    assert ref.returncode == 0, ref.stdout + ref.stderr
    for got, want in zip(results, ref_results):
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5), (got, want)


_BAD_INDEX = """
import os, torch
rank = int(os.environ["LOCAL_RANK"])
assert torch.tpu.device_count() == 2 and torch.accelerator.device_count() == 2
assert torch.tpu.current_device() == rank
x = torch.ones(2, device="tpu:0") + torch.ones(2, device=f"tpu:{rank}")  # both spellings
assert x.device == torch.device("tpu", rank) and x.cpu().tolist() == [2.0, 2.0]
# rank 1's only other index is 0, its own device's other name
for bad in ((2, 1) if rank == 0 else (2,)):
    try:
        torch.zeros(1, device=f"tpu:{bad}")
    except RuntimeError as e:
        print(f"RANK{rank} BAD{bad}: {e}", flush=True)
    else:
        raise SystemExit(f"tpu:{bad} was accepted by rank {rank}")
"""


def test_an_index_of_no_or_another_process_raises_naming_the_own_device(tmp_path):
    script = tmp_path / "bad_index.py"
    script.write_text(_BAD_INDEX)
    out, _ = _torchrun(script)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "RANK1 BAD2: Invalid device tpu:2: this process drives tpu:1" in log, log
    assert "No process of this job has tpu:2" in log
    assert "RANK0 BAD1: Invalid device tpu:1: this process drives tpu:0" in log
    assert "tpu:1 belongs to local rank 1, another process" in log


def test_outside_torchrun_one_device():
    code = """
import torch
assert torch.tpu.device_count() == 1 and torch.tpu.current_device() == 0
assert torch.ones(1, device="tpu").device == torch.device("tpu", 0)
torch.tpu.set_device(0)
try:
    torch.tpu.set_device(1)
except RuntimeError as e:
    print(e)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "Invalid device tpu:1: this process drives tpu:0 (one process per device" in out.stdout
