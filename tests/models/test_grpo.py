"""examples/grpo.py, GRPO in plain PyTorch, run as a user runs it: a subprocess on tpu.

The reward must rise on the toy task, as it does on CPU; and policy updates must never
recompile: weights are program arguments, and every shape of the loop is fixed, so after
the first two iterations (the second adds AdamW's state, created by the first step) no
iteration compiles a program in Strict, DeferAndFuse or with torch.compile on the forward.
Counted by the example's `--programs` (torch.tpu.compile_cache_stats: per-op executables,
fused graphs and compiled graphs), the count after iteration 2 must equal the count after
every later one, iteration 10 included.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "grpo.py"
SRC = str(pathlib.Path(__file__).parents[2] / "src")
pytestmark = pytest.mark.slow  # each run imports transformers and compiles a small Llama's programs


def run_example(*args: str, env: dict | None = None, timeout: float = 240) -> dict:
    # no TORCH_TPU_ setting of this environment (as tests/helpers/user_script.py): the mode
    # is the one the arguments name
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    full.update(OMP_NUM_THREADS="1", TORCH_TPU_RECOMPILE_WARN="0",
                PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), **(env or {}))
    p = subprocess.run([sys.executable, str(EXAMPLE), "--json", *args], env=full,
                       capture_output=True, text=True, timeout=timeout, check=False)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _mean(xs):
    return sum(xs) / len(xs)


def _assert_warm_after_two(programs):
    assert len(programs) >= 3 and programs[2:] == [programs[1]] * (len(programs) - 2), (
        f"programs compiled after each iteration: {programs}")


def test_reward_rises_on_tpu_as_on_cpu():
    """30 iterations in Strict (the default mode): the mean reward of the last five is
    well above that of the first five, as in the same run on CPU eager. The two sample
    from different generators, so only the trend and the level are compared."""
    got = run_example("--iterations", "30", "--programs")
    want = run_example("--iterations", "30", "--device", "cpu")
    for r in (got, want):
        # the untrained policy's reward is about 1/vocab (~0.03)
        first, last = _mean(r["rewards"][:5]), _mean(r["rewards"][-5:])
        assert r["rewards"][0] < 0.1 and last > first + 0.3, r["rewards"]
    assert abs(_mean(got["rewards"][-5:]) - _mean(want["rewards"][-5:])) < 0.2, (got, want)
    _assert_warm_after_two(got["programs"])


@pytest.mark.parametrize("variant", ["defer_and_fuse", "compile"])
def test_no_recompiles_across_policy_updates(variant):
    """10 iterations: every program after iteration 2 was compiled by then (Strict is
    counted by the test above)."""
    args = ["--compile"] if variant == "compile" else ["--mode", variant]
    got = run_example("--iterations", "10", "--programs", *args)
    _assert_warm_after_two(got["programs"])
    assert _mean(got["rewards"][-3:]) > _mean(got["rewards"][:3]), got["rewards"]
