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


def test_device_map_places_on_the_device_and_generates_the_cpus_tokens():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    got = json.loads(line[len("RESULT "):])
    for name in ("auto", "balanced", "index", "auto_limits"):
        assert got[name] == {"devices": ["tpu:0"], "same_tokens": True}, (name, got)
    assert "this process can place weights on tpu:0" in got["other_index"]
    assert "Device 0 is not available" not in proc.stderr + proc.stdout
