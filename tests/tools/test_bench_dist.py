"""`python -m torch_tpu bench dist`: FSDP2 and TP Llama steps under torchrun, tpu_dist
(Strict, DeferAndFuse) against gloo, at 2 processes and a tiny sequence, run as a user
runs it: every row measured, the loss curves agreeing; and the collectives' bandwidth
sweep, every op at every size with its verdicts."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def test_bench_is_registered():
    from torch_tpu_tools.bench import BENCHES

    assert BENCHES["dist"][0] == "torch_tpu_tools.bench.dist"


@pytest.mark.slow
@pytest.mark.distributed
def test_cli_two_processes_fsdp_and_tp():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    r = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "bench", "dist", "--nproc", "2", "--workloads",
         "fsdp,tp", "--modes", "defer_and_fuse", "--steps", "3", "--seq", "64",
         "--timeout", "300", "--no-write"],
        check=False, capture_output=True, text=True, timeout=1200, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Errors:" not in r.stdout, r.stdout
    rows = [[c.strip() for c in ln.strip("|").split("|")]
            for ln in r.stdout.splitlines() if ln.startswith(("| fsdp", "| tp"))]
    assert [row[:2] for row in rows] == [["fsdp", "2"], ["tp", "2"]], r.stdout
    for row in rows:  # DeferAndFuse only: Strict FSDP2 and TP run in tests/distributed
        assert all(re.fullmatch(r"\d+\.\d{3}", v) for v in row[2:4]), row   # s/step
        assert re.fullmatch(r"\d+\.\d\d×", row[4]), row   # tpu / gloo
        assert float(row[5]) < 1e-3, row  # the same losses as gloo, step by step
        assert re.fullmatch(r"\d+", row[6]), row  # programs compiled while measured
        assert "met" in row[7], row
    sizes = ["4 KB", "64 KB", "1 MB", "4 MB", "16 MB", "64 MB"]
    for op in ("all_reduce", "all_gather", "reduce_scatter"):  # the bandwidth sweep
        found = [ln.split("|")[2].strip() for ln in r.stdout.splitlines() if ln.startswith(f"| `{op}`")]
        assert found == sizes, (op, r.stdout[-3000:])
    assert re.search(r"all_reduce 4 MB: \d+\.\d\d× \(≥ 1\.0× gloo at 4 MB\)", r.stdout), r.stdout
