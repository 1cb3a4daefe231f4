"""`python -m torch_tpu bench loops`: the loops users write, each variant in a process of
its own; the report reads the children's results (issue 52)."""
import subprocess
import sys

import pytest

from torch_tpu_tools.bench import BENCHES, loops


def test_bench_is_registered():
    assert BENCHES["loops"][0] == "torch_tpu_tools.bench.loops"


def test_report_reads_ratios_targets_and_values():
    cpu = {n: {"ms": 10.0, "last": [1, 2], "late_programs": 0} for n in loops.LOOPS}
    daf = {n: {"ms": 5.0 if n == "hf_generate" else 20.0, "last": [1, 2], "late_programs": 0}
           for n in loops.LOOPS}
    daf["kv_loop"]["last"] = [1, 3]
    body, tpu = loops.render({"cpu": cpu, "defer_and_fuse": daf,
                              "strict": {"error": "the child process failed (1): boom"}}, 1.0)
    assert tpu == ["defer_and_fuse", "strict"]
    assert "| HF generate, 32 tokens | 10.0 | 5.0 | (the child process failed" in body
    assert "**2.00x** ✓" in body and "**0.50x** (miss)" in body
    assert "- KV-cache loop, 64 tokens, DeferAndFuse: 0.50x CPU eager (misses ≥ 1.0x)" in body
    kv = next(line for line in body.splitlines() if line.startswith("| KV-cache loop"))
    assert kv.endswith("| 0 | no |")  # the tokens differ from CPU's


@pytest.mark.slow
def test_cli_runs_cpu_and_defer_and_fuse_in_processes_of_their_own(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch_tpu", "bench", "loops", "--rounds", "1",
                           "--variants", "cpu,defer_and_fuse", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (tmp_path / "PERFORMANCE.md").read_text()
    assert (tmp_path / loops.CHART).exists()
    for label in loops.LOOPS.values():
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        # every loop repeats: no program after the warm-up, and CPU's tokens and losses
        assert row.endswith("| 0 | yes |"), row
