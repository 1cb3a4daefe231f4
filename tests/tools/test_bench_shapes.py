"""`python -m torch_tpu bench shapes --quick`: every cell of its tables is filled (programs
compiled, cold seconds, warm throughput next to CPU eager's, agreement with CPU), and the
program counts are positive integers. The quick run uses a tiny model and tiny lengths and
writes nothing into docs/."""
import re
import subprocess
import sys

import pytest

from torch_tpu_tools.bench import BENCHES, shapes

CASES = ("generate", "train", "lm loop")


def _rows(text: str, first: str) -> list[list[str]]:
    """The cells of the markdown rows whose first cell is `first`."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] == first:
            out.append(cells)
    return out


def test_bench_is_registered():
    assert BENCHES["shapes"][0] == "torch_tpu_tools.bench.shapes"


def test_training_lengths_are_bounded_and_seeded():
    lengths = shapes.train_lengths(50, 16, 512)
    assert lengths == shapes.train_lengths(50, 16, 512)
    assert len(lengths) == 50 and all(16 <= n <= 512 for n in lengths)
    assert len(set(lengths)) > 10


@pytest.mark.slow
def test_quick_bench_fills_every_cell():
    # one mode: each mode is a fresh process plus two for the cold generates, and on a
    # loaded 2-core machine each costs tens of seconds of compiles
    proc = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "bench", "shapes", "--quick", "--modes", "strict",
         "--no-write"], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for case in CASES:
        rows = _rows(text, case)
        assert rows, (case, text)
        for cells in rows:
            assert len(cells) == 12, cells
            _, _, mode, progs, warm_progs, cold, cpu_cold, warm, cpu_warm, ratio, agree, note = cells
            assert mode == "Strict" and note == "", cells
            m = re.fullmatch(r"(\d+) \((\d+)\)", progs)
            # programs the call compiled (fused graphs: none in Strict); generation runs
            # the longest length first, and the shorter ones reuse its bucket
            shorter = case == "generate" and cells is not rows[0]
            assert m and (int(m.group(1)) == 0 if shorter else int(m.group(1)) > 0), cells
            assert int(warm_progs) >= 0
            for x in (cold, cpu_cold, warm, cpu_warm):
                assert float(x) > 0, cells
            assert ratio.endswith("x") and float(ratio[:-1]) > 0
            assert agree == "yes", cells
    assert [r[1] for r in _rows(text, "generate")] == ["4", "3", "2"]  # the quick lengths
    cold = _rows(text, "Strict")
    assert [c[1] for c in cold] == ["empty", "warm disk"], cold
    for c in cold:
        assert c[2] == "3/3" and float(c[3]) > 0 and c[-1] == "", c
        assert int(c[6]) + int(c[7]) > 0, c    # XLA compiles + disk hits
    assert int(cold[1][6]) <= int(cold[0][6]) and int(cold[1][7]) > 0  # the disk cache served
    assert "### Issue 15's targets" in text


def test_clients_targets_read_the_results():
    """The client rows' targets: generate's programs and compile seconds at 128 tokens
    against 16, ratios against the padded run and CPU's warm step."""
    from torch_tpu_tools.bench import shapes_clients as sc

    res = {"trainer": {"cpu": {"first_s": 0.1, "warm_s": 0.01, "wall_s": 1.0},
                       "strict": {"first_s": 5.0, "warm_s": 0.02, "wall_s": 12.0,
                                  "programs": 90, "late_programs": 0}},
           "trainer_max": {"cpu": {"wall_s": 1.0}, "strict": {"wall_s": 10.0}},
           "generate16": {"cpu": {"first_s": 0.02}, "strict": {"first_s": 20.0,
                                                               "programs": 233, "compile_s": 19.0}},
           "generate128": {"cpu": {"first_s": 0.3}, "strict": {"first_s": 38.0,
                                                                "programs": 466, "compile_s": 38.0}},
           "first_step": {"cpu": {"first_s": 0.03},
                          "strict": {"error": "the child process ran past 240 s"}}}
    text = sc.render(res, ["cpu", "strict"], 1.0)
    assert "wall time: **1.20x** (≤ 1.5x" in text and "second epoch: 0" in text
    assert "programs **2.00x** (466 against 233)" in text and "seconds **2.00x** (38.00" in text
    assert "(the child process ran past 240 s)" in text and "(≤ 3 s: n/a)" in text
    assert _rows(text, "trainer")[0][1:4] == ["0.10", "5.00", "**50.00x**"]


@pytest.mark.slow
def test_clients_run_in_fresh_processes_beside_cpu():
    proc = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "bench", "shapes", "--clients", "first_step",
         "--modes", "strict", "--no-write"], capture_output=True, text=True, timeout=600,
        check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cells = _rows(proc.stdout, "first_step")[0]
    cpu_s, tpu_s, programs = float(cells[1]), float(cells[2]), int(cells[6])
    assert 0 < cpu_s < tpu_s and programs > 10, cells  # the tpu step compiled its programs
