"""Smoke test of `python -m torch_tpu bench graphs`: the decode workload measured in Strict
and captured for one round, the captured tokens equal to Strict's, and the report rendered
(nothing is written to docs/)."""
import pytest

from torch_tpu_tools.bench import BENCHES, graphs
from torch_tpu_tools.workloads import decoder


def test_bench_is_registered():
    assert BENCHES["graphs"][0] == "torch_tpu_tools.bench.graphs"


@pytest.mark.slow
def test_decode_measured_captured_and_reported():
    base = decoder.build_model(graphs.DECODE_SPEC)
    res = graphs._measure({n: (lambda n=n: graphs.Decode(base, "tpu", n == "captured"))
                           for n in ("strict", "captured")}, 1, None)
    assert res["captured"]["losses"] == res["strict"]["losses"]  # the greedy tokens
    assert all(r["warm"] > 0 and r["first"] > 0 for r in res.values())
    fake = {**res, "defer_and_fuse": res["strict"]}
    cpu = {"cpu": {"warm": 1.0, "first": 1.0, "losses": []}}
    body = graphs._report({"decode": fake, "train": fake}, {"decode": cpu, "train": cpu})
    assert "| decode | captured |" in body and "Targets (issue 34)" in body
