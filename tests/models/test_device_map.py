"""`from_pretrained(device_map=...)` on tpu (accelerate's get_max_memory learns the device:
_integrations/accelerate.py): "auto" and "balanced" put a model that fits on the device,
never on the CPU, and generate() gives the CPU's tokens."""
import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "device_map_generate.py"
SRC = str(pathlib.Path(__file__).parents[2] / "src")


def _run(env):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), proc


def test_device_map_places_on_the_device_and_generates_the_cpus_tokens():
    got, proc = _run({})
    for name in ("auto", "balanced", "index", "auto_limits"):
        assert got[name] == {"devices": ["tpu:0"], "same_tokens": True}, (name, got)
    assert "this process can place weights on tpu:0" in got["other_index"]
    assert "Device 0 is not available" not in proc.stderr + proc.stdout


def test_device_map_over_four_devices_in_one_process():
    """One process with four devices (a GPU box's layout): "auto" and "balanced" spread a
    small Llama over them, limits spread it further, an index puts it on that device, and
    generate() gives the CPU's tokens every time."""
    got, proc = _run({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert got["count"] == 4
    for name in ("auto", "balanced", "split"):
        assert got[name]["same_tokens"], (name, got)
        assert len(got[name]["devices"]) > 1 and "cpu" not in got[name]["devices"], (name, got)
    assert got["index"] == {"devices": ["tpu:3"], "same_tokens": True}
    assert got["auto_limits"] == {"devices": ["tpu:0"], "same_tokens": True}
    assert "tpu:0, tpu:1, tpu:2, tpu:3" in got["other_index"]
    assert "Execute()" not in proc.stderr  # (no program met a buffer of another device)
