"""`python -m torch_tpu bench soak`, short: training with generation in between keeps the
device bytes, the programs and the GC-tracked objects flat after warm-up, in Strict and
DeferAndFuse, each in its own process (the command exits 1 when a variant is not flat;
the full run, `bench soak`, also compares the losses with CPU eager's)."""
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_short_soak_is_flat():
    proc = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "bench", "soak", "--steps", "40", "--every", "10",
         "--warm", "20", "--generate-every", "10", "--variants", "strict", "defer_and_fuse",
         "--no-write"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")][2:]
    assert len(rows) == 2 and all(r.rstrip(" |").endswith("yes") for r in rows), proc.stdout
