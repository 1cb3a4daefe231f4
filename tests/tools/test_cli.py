"""The command line: `python -m torch_tpu info | demo | bench`, run as a user runs them."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"  # the checkout's own docs


def run_cli(*args, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return subprocess.run([sys.executable, "-m", "torch_tpu", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def fields(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def test_info_reports_versions_platform_mode_and_lowerings():
    import jax
    import torch

    r = run_cli("info", timeout=300)
    assert r.returncode == 0, r.stderr
    f = fields(r.stdout)
    assert f["torch"] == torch.__version__
    assert f["jax"] == jax.__version__
    assert f["jaxlib"] == jax.__version__  # pinned together
    assert f["PJRT platform"] in ("cpu", "tpu", "cuda", "gpu")
    assert f["device kind"]
    assert f["local devices"] and f["binding"].startswith(f["PJRT platform"])
    assert f["eager mode"] in ("strict", "debug", "defer_and_fuse")
    assert int(f["lowerings"]) > 0


@pytest.mark.slow  # (a fresh interpreter per case)
@pytest.mark.parametrize("argv, bad", [(["nope"], "nope"), (["bench", "nope"], "nope")])
def test_unknown_command_is_a_clear_error(argv, bad):
    r = run_cli(*argv, timeout=300)
    assert r.returncode == 2
    assert "invalid choice" in r.stderr and bad in r.stderr


@pytest.mark.slow
def test_bench_ops_runs_without_writing_docs():
    r = run_cli("bench", "ops", "--rounds", "2", "--reps", "2", "--no-llama", "--no-write")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| op | size |" in r.stdout
    for op in ("add", "mm", "softmax", "add_"):
        assert f"| `{op}` | small |" in r.stdout
    assert "- Strict floor, small size: add " in r.stdout


def test_strict_floor_line_judges_each_op_against_the_target():
    from torch_tpu_tools.bench.ops import OpResult, _floor_line

    def res(name, tpu, size="small"):
        return OpResult(name, size, ((4,),), {"tpu": tpu, "jit": 10.0, "cpu": 2.0})

    under = [res("add", 12.5), res("mul", 13.0), res("sum", 11.0), res("relu", 12.9),
             res("mm", 30.0), res("add", 40.0, "medium")]  # mm and medium sizes: not judged
    assert _floor_line(under).endswith("target ≤ 3 µs for each: met)")
    assert "add 2.5, mul 3.0, sum 1.0, relu 2.9 µs" in _floor_line(under)
    assert _floor_line([*under[:3], res("relu", 13.2)]).endswith("not met)")


def test_write_section_replaces_only_its_own_section(tmp_path):
    from torch_tpu_tools.bench import common

    md = tmp_path / "PERFORMANCE.md"
    common.write_section("a", "A", "first a", md)
    common.write_section("b", "B", "only b", md)
    common.write_section("a", "A", "second a", md)
    text = md.read_text()
    assert "second a" in text and "first a" not in text and "only b" in text
    assert text.count("<!-- bench:a:begin -->") == 1
    assert text.index("bench:a:begin") < text.index("bench:b:begin")


@pytest.mark.parametrize("name", ["compile", "modes", "scaling", "rl"])
def test_each_bench_section_carries_its_notes_from_docs(name):
    """The hand-written reading of a bench's figures lives in docs/bench_notes/NAME.md;
    the section the bench last wrote into PERFORMANCE.md holds it word for word."""
    from torch_tpu_tools.bench import common

    notes = common.notes(DOCS, name)
    assert notes.startswith("### Reading these numbers\n\n- **"), notes[:80]
    section = (DOCS / "PERFORMANCE.md").read_text().split(f"<!-- bench:{name}:begin -->")[1]
    assert notes in section.split(f"<!-- bench:{name}:end -->")[0], (
        f"PERFORMANCE.md's {name} notes differ from docs/bench_notes/{name}.md: edit the "
        "notes there (a bench run rewrites its section from them), then copy them over")


@pytest.mark.slow
def test_demo_trains_with_parity():
    r = run_cli("demo", "--steps", "3", "--no-progress")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # (a missing lowering fails here)
    assert "PASS" in r.stdout and "FAIL" not in r.stdout
    assert "XLA:CPU stands in for the accelerator" in r.stdout
    warm = r"[\d,]+\s+[\d.]+\s+[\d.]+x"  # warm tokens/s, ms, ratio to CPU
    for run in ("CPU eager", "tpu Strict", "tpu DeferAndFuse", "tpu compiled"):
        line = re.search(rf"^  {run}\s+(?:{warm}|-\s+-\s+-)\s+(none|\d+ in [\d.]+s)", r.stdout, re.M)
        assert line, run
        # the compile cost stands apart: tpu runs build programs (at least in step 1)
        assert (line.group(1) == "none") == (run == "CPU eager"), line.group(0)
    for run in ("CPU eager", "tpu Strict"):  # warm from step 2 on
        assert re.search(rf"^  {run}\s+{warm}", r.stdout, re.M), run
    losses = re.findall(r"^\s+\d+((?:\s+[\d.]+){4})\s*$", r.stdout, re.M)  # a loss per run
    assert len(losses) == 3
