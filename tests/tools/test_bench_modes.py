"""Smoke test of `python -m torch_tpu bench modes`: its measuring functions on a tiny model
with one or two calls each, and the report they render (nothing is written to docs/)."""
import pytest

from torch_tpu_tools.bench import modes, modes_report
from torch_tpu_tools.workloads import decoder

TINY = decoder.DecoderSpec(hidden=16, layers=1, heads=2, kv_heads=1, vocab=64, seq=8, batch=2,
                           prompt=4, new_tokens=2, gen_batch=1, pad=0)


def test_bench_is_registered():
    from torch_tpu_tools.bench import BENCHES

    assert BENCHES["modes"][0] == "torch_tpu_tools.bench.modes"


@pytest.mark.slow
def test_measuring_functions_and_report():
    base = decoder.build_model(TINY, "llama")
    # DeferAndFuse only among the tpu modes: compiles dominate this test's time, and the
    # Strict and Debug paths differ from it only in the mode entered
    train = modes.measure(base, "llama", modes.TRAIN, TINY,
                          variants=("defer_and_fuse", "cpu"), rounds=1, warmup=0)
    assert not train.errors, train.errors
    for v in ("defer_and_fuse", "cpu"):
        assert train.tok_s(v) > 0 and train.first_s[v] > 0
    assert train.peak["defer_and_fuse"] >= train.resident["defer_and_fuse"] > 0
    assert train.agree["defer_and_fuse"]  # same losses as CPU eager
    # DeferAndFuse flushed at the optimizer step's end in the measured step (so loss.item()
    # found the graph already run)
    assert train.counts["defer_and_fuse"].get("flush.optimizer_step", 0) >= 1

    infer = modes.measure(base, "llama", modes.INFER, TINY,
                          variants=("defer_and_fuse", "cpu"), rounds=1, warmup=0)
    assert not infer.errors, infer.errors
    assert infer.tokens == TINY.new_tokens * TINY.gen_batch
    assert infer.agree["defer_and_fuse"]  # greedy tokens identical to CPU's
    assert infer.tok_s("defer_and_fuse") > 0

    rec = modes.measure_record(n_ops=40, rounds=2)
    assert not rec.errors, rec.errors
    assert rec.flushed_while_recording == 0
    assert rec.us["defer_record"] > 0 and rec.us["strict_dispatch"] > 0

    asserts = modes.measure_asserts(base, TINY, rounds=1, warmup=0)
    assert not asserts.errors, asserts.errors
    assert all(min(on) > 0 and min(off) > 0 for on, off in asserts.samples.values())

    text = modes_report.render([train, infer], rec, TINY, {modes.TRAIN: 1, modes.INFER: 1, "record": 2}, 1.0,
                               asserts)
    assert "### Device-side asserts" in text and "device-side asserts, Llama train, Strict" in text
    assert "| Llama | train |" in text and "| Llama | infer |" in text
    assert "DeferAndFuse recording" in text
