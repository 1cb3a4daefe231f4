"""A process's memory mappings near Linux's limit (vm.max_map_count), the state in which
DeferAndFuse processes that had run many programs crashed (issue 53: PyTorch's op tests,
and the model zoo in one process): XLA could not map the next program's code, and the C++
exception that reported it crashed the unwinder. _maps.py has the mechanism.

- the user's own mappings: a CUDA-style training script that maps regions until 150 are
  left gets a MapLimitError naming the limit at its next new program, in Strict and
  DeferAndFuse; after releasing them it trains on, with CPU's losses;
- the programs' mappings: under a small limit (set in the child), a process that compiles
  hundreds of programs holds fewer of them and stays clear of the limit, with right values.
"""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from helpers.dist_launch import run_single, swap_cuda

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "many_mappings.py"
QUIET = {"TORCH_TPU_RECOMPILE_WARN": "0"}
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/sys/vm/max_map_count"),
                                reason="Linux's mapping limit")


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_process_out_of_mappings_gets_an_error_and_goes_on(mode, tmp_path):
    want = run_single(SCRIPT, env={**QUIET, "FORCE_CPU": "1"}, timeout=300)[0]
    env = {**QUIET, **({"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "defer_and_fuse" else {})}
    got, out = run_single(swap_cuda(SCRIPT, tmp_path / "mappings_tpu.py"), env=env,
                          timeout=300)
    assert got["error"] and got["error"].startswith("MapLimitError"), out[-3000:]
    assert "vm.max_map_count" in got["error"] and "mappings_tpu.py" in got["error"], got
    for a, b in zip(got["losses"], want["losses"], strict=True):
        assert abs(a - b) < 1e-5, (got["losses"], want["losses"])


_MANY_PROGRAMS = textwrap.dedent("""
    import json
    import torch, torch_tpu
    from torch_tpu import _maps, metrics

    base = _maps.count()
    _maps.LIMIT = int((base + 100) / _maps.HIGH)  # a small limit: the programs reach it
    worst, ok = 0, True
    for n in range(1, 401):
        x = torch.arange(n, dtype=torch.float32, device="tpu")
        ok &= (x * 2 + 1).sum().item() == n * n  # a new program per size
        worst = max(worst, _maps.count())
    c = metrics.as_dict()["counters"]
    print(json.dumps({"ok": ok, "worst": worst, "limit": _maps.LIMIT,
                      "limited": c.get("programs.map_limited", 0),
                      "evicted": sum(v for k, v in c.items() if k.endswith(".evictions"))}))
""")


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_the_program_cache_stays_clear_of_the_limit(mode):
    env = dict(os.environ, **QUIET)
    if mode == "defer_and_fuse":
        env["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    out = subprocess.run([sys.executable, "-c", _MANY_PROGRAMS], env=env, text=True,
                         capture_output=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"] and r["limited"] >= 1 and r["evicted"] > 0, r
    assert r["worst"] < r["limit"] * 0.97, r
