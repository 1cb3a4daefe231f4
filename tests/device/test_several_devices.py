"""Several devices in one process, the CUDA model (docs/DEVICES.md): with four XLA:CPU
devices visible (a GPU box's or a TPU host's chips, simulated), CUDA scripts with only
"cuda" -> "tpu" changed, run as subprocesses in every eager mode and compiled:
  - tensors on tpu:0..3 live on four distinct runtime devices, the current device follows
    set_device / `with torch.tpu.device(i)`, copies between devices are exact (no host
    round trip), mixing devices is CUDA's error, each device has its own generator, and a
    layer trained on tpu:1 stays there with the CPU's loss;
  - PyTorch's model-parallel tutorial (two halves on two devices, a four-stage pipeline)
    trains with the CPU's values in Strict, DeferAndFuse, Debug and compiled."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from helpers.dist_launch import SRC, swap_cuda

SCRIPTS = pathlib.Path(__file__).parents[1] / "user_code"
FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
MODES = {"strict": {}, "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"},
         "debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"}}


def _run(script, env):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")},
           "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "TORCH_TPU_RECOMPILE_WARN": "0", **env}
    proc = subprocess.run([sys.executable, str(script)], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    assert "Execute()" not in proc.stderr, proc.stderr[-3000:]  # no buffer met another device
    return json.loads(line[len("RESULT "):])


def _cpu_loss():
    """several_devices.py's training of its layer, on the CPU."""
    x = torch.arange(6.0).reshape(2, 3)
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    for _ in range(3):
        loss = layer(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("mode", list(MODES))
def test_tensors_devices_copies_and_errors(tmp_path, mode):
    script = swap_cuda(SCRIPTS / "several_devices.py", tmp_path / "several.py")
    got = _run(script, {**FOUR, **MODES[mode], "CHECK_BUFFERS": "1"})
    assert got["count"] == 4
    assert got["devices"] == [f"tpu:{i}" for i in range(4)]
    base = torch.arange(6.0).reshape(2, 3)
    assert got["values"] == [(base * (i + 1)).tolist() for i in range(4)]
    assert (got["current"], got["inner_current"], got["after"]) == (2, 3, 2)
    assert (got["made"], got["inner"]) == ("tpu:2", "tpu:3")
    assert got["moved"] == base.tolist() and got["moved_device"] == "tpu:1"
    dst = torch.zeros(3, 4)
    dst[:, 1:3] = (base * 3).t()
    assert got["dst"] == dst.tolist()
    assert got["cast"] == (base * 2).tolist() and got["cast_dtype"] == "torch.float64"
    assert got["mixed"].startswith("Expected all tensors to be on the same device, but found at "
                                   "least two devices, tpu:0 and tpu:1!")
    assert got["mixed_out"] == "Expected out tensor to have device tpu:0, but got tpu:1 instead"
    assert got["still"] == base.sum().item() * 2
    assert got["picked"] == [(base * (i + 1))[:, [2, 0]].tolist() for i in range(4)]
    assert got["rng_same_seed"] and got["rng_restored"] and got["rng_states"] == 4
    assert abs(got["loss"] - _cpu_loss()) <= 1e-5
    assert got["grad_device"] == "tpu:1"
    assert got["buffers"] == {"x0": [0], "x1": [1], "x2": [2], "x3": [3], "made": [2],
                              "inner": [3], "moved": [1], "dst": [3], "cast": [2], "a": [1],
                              "b": [2], "weight": [1], "grad": [1], "adam": [1],
                              "ids0": [0], "ids3": [3]}
    assert got["direct_fallbacks"] == 0
    assert got["memory_grown"] == [0, 0, 0, 1 << 22], got["memory_grown"]
    assert got["peak_3"] and got["free_less_on_3"]


@pytest.fixture(scope="module")
def model_parallel_cpu():
    return _run(SCRIPTS / "model_parallel.py", {"FORCE_CPU": "1"})


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug", "compiled"])
def test_model_parallel_tutorial_matches_cpu(tmp_path, mode, model_parallel_cpu):
    script = swap_cuda(SCRIPTS / "model_parallel.py", tmp_path / "mp.py")
    env = {**FOUR, **(MODES.get(mode) or {"COMPILE": "1"})}
    got = _run(script, env)
    want = model_parallel_cpu
    assert got["devices"] == ["tpu:0", "tpu:1"] and got["out_device"] == "tpu:1"
    assert got["stage_devices"] == [f"tpu:{i}" for i in range(4)] and got["count"] == 4
    for key in ("losses", "pipe"):
        torch.testing.assert_close(torch.tensor(got[key]), torch.tensor(want[key]), rtol=1e-5, atol=1e-5)
    for a, b in zip(got["params"], want["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    assert got["round"] == want["round"]  # copies are exact


def test_one_device_visible_keeps_one_device():
    """Without the flag a process has one device, and tpu:1 is refused, naming it."""
    out = subprocess.run([sys.executable, "-c", (
        "import torch\nprint(torch.tpu.device_count())\n"
        "try:\n    torch.ones(2, device='tpu:1')\nexcept RuntimeError as e:\n    print(e)")],
        env={**os.environ, "PYTHONPATH": SRC}, text=True, capture_output=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[0] == "1" and "Invalid device tpu:1" in lines[1], out.stdout + out.stderr
