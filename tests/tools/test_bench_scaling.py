"""`python -m torch_tpu bench scaling`: its FLOPs count against XLA's, where it says a mode
crosses CPU eager, and the command itself on a tiny grid, run as a user runs it."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from torch_tpu_tools.bench import scaling, scaling_report


def test_bench_is_registered():
    from torch_tpu_tools.bench import BENCHES

    assert BENCHES["scaling"][0] == "torch_tpu_tools.bench.scaling"


def test_model_flops_match_xla_cost_analysis():
    """The analytic matmul FLOPs of a forward pass against XLA's count for the hand-written
    JAX forward of the same model (which adds the elementwise ops: a few percent)."""
    import jax

    from torch_tpu_tools.bench import compile as bench_compile
    from torch_tpu_tools.workloads import decoder

    spec = scaling.spec_for(64, 4, 32)
    model = decoder.build_model(spec)
    params, _, forward = bench_compile.jax_llama(model, spec)
    ids = jax.numpy.zeros((spec.batch, spec.seq), jax.numpy.int32)
    cost = forward.lower(params, ids).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    analytic = scaling._forward_flops(spec, spec.batch, spec.seq, spec.seq, spec.seq)
    assert 1.0 <= cost["flops"] / analytic < 1.15, (cost["flops"], analytic)
    # training is three forwards' worth; generation the prefill plus the decode steps
    assert scaling.flops(spec, scaling.TRAIN, 8) == 3 * analytic
    gen = scaling.flops(spec, scaling.GEN, 8)
    assert scaling._forward_flops(spec, 4, 32, 32, 1) < gen < 2 * analytic


def test_crossings_are_interpolated_between_neighbours():
    pts = [(1e6, 0.5, "a"), (1e7, 2.0, "b"), (1e8, 4.0, "c"), (1e9, 0.25, "d")]
    xs = scaling_report.crossings(pts)
    assert [(d, cells) for _, d, cells in xs] == [("above", ("a", "b")), ("below", ("c", "d"))]
    # log-log: 0.5 -> 2.0 crosses 1 halfway between 1e6 and 1e7
    assert xs[0][0] == pytest.approx(10 ** 6.5)
    assert scaling_report.crossings([(1e6, 1.2, "a"), (1e7, 3.0, "b")]) == []


def _rows(stdout: str, title: str) -> list[list[str]]:
    """The data rows of the table that follows the line starting with `title`."""
    block = stdout.split(title, 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]


@pytest.mark.slow
def test_cli_tiny_grid_reports_every_cell():
    """One width, one batch x seq, both workloads; every contestant but inductor, whose
    cold compile of the training step alone takes a minute or more on 2 shared cores
    (each cell compiles every contestant: the CI budget)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    r = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "bench", "scaling", "--widths", "16",
         "--tokens", "2x8", "--new-tokens", "2", "--cell-seconds", "0.2",
         "--min-rounds", "1", "--skip", "inductor", "--no-write"],
        check=False, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "Errors:" not in out, out
    names = ["Strict", "DeferAndFuse", "compiled", "CPU eager", "jax.jit"]
    cells = {(w, "16", "2x8") for w in ("train", "generate")}
    for title, pattern in (("Median ms per call", r"[\d,]+\.\d\d"),
                           ("Ratio to CPU eager", r"\d+\.\d\dx"),
                           ("Ratio to the hand-written jax.jit", r"\d+\.\d\dx")):
        rows = _rows(out, title)
        assert {tuple(row[:3]) for row in rows} == cells, (title, rows)
        for row in rows:
            values = row[4:4 + len(names)]
            assert len(values) == len(names) and all(re.fullmatch(pattern, v) for v in values), row
            assert float(row[3]) > 0  # GFLOP per call
    for row in _rows(out, "Ratio to CPU eager"):
        assert row[4 + names.index("CPU eager")] == "1.00x"
    # every mode generated CPU eager's greedy tokens; the summary names each mode
    assert "Greedy tokens differing from CPU eager's: none" in out
    for mode in ("tpu Strict", "tpu DeferAndFuse", "tpu compiled", "jax.jit"):
        assert f"- {mode}: " in out
