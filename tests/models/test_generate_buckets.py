"""HF `generate()` on tpu compiles per bucket of its length, not per token (issue 15, item 3).

Each test runs tests/user_code/generate_lengths.py (a user's generation script, "cuda" made
"tpu") in a fresh process, and counts the programs each call compiled (stable, unlike
times). Every result is compared with the same call on CPU (greedy) or with transformers'
own decoding loop on tpu (sampled: same generator, same draws)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "generate_lengths.py"
MODES = ("strict", "defer_and_fuse", "static")


def _generate(mode, lengths, *flags):
    return _run(mode, lengths, *flags)[0]


def _run(mode, lengths, *flags):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--mode", mode, "--lengths", lengths, *flags],
                          capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    *calls, summary = rows
    assert summary["unbucketed"] == {} and summary["bucketed"] == len(calls), summary
    assert all(c["equal"] for c in calls), calls
    return calls, summary


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_256_tokens_compile_at_most_twice_16_then_shorter_calls_nothing(mode):
    """The issue's bound: a fresh process's 256-token call compiles at most 2x what a fresh
    16-token call does, and after it no call of any length up to 256 compiles anything."""
    (short,) = _generate(mode, "16")
    long, *after = _generate(mode, "256,16,100,255,7")
    assert long["shape"] == [1, 264] and short["shape"] == [1, 24]
    assert long["programs"] <= 2 * short["programs"], (short, long)
    assert [c["programs"] for c in after] == [0] * len(after), after


def test_sampled_generate_draws_as_transformers_loop_and_stays_bounded():
    """do_sample with top-k/top-p on the tpu generator, with a streamer: the bucketed loop
    draws exactly the tokens transformers' own loop draws on tpu, the streamer gets what it
    gets there, and a longer length in the same bucket (8 + 20 and 8 + 24 tokens: capacity
    32) compiles nothing."""
    first, second = _generate("strict", "20,24", "--sample")
    assert second["programs"] == 0, (first, second)


@pytest.mark.parametrize("mode", ("debug", "defer_and_fuse", "static"))
def test_padded_batch_with_eos_equals_cpu(mode):
    """A batch of two, one prompt left-padded, an EOS that one row reaches early:
    sequences equal CPU's, the returned scores are CPU's within 1e-4, and a second call in
    the same bucket compiles nothing."""
    first, second = _generate(mode, "16,20", "--batch-eos")
    assert first["eos_rows"] == 1 and first["scores_close"] and second["scores_close"], first
    assert second["programs"] == 0, second


@pytest.mark.parametrize("mode", ("strict", "defer_and_fuse", "static"))
def test_decode_step_captured_and_replayed(mode):
    """Greedy, a left-padded batch with an EOS one row reaches early, no scores: the first
    call captures its decode step and replays it, several tokens a launch (each replayed
    step counted), the second (same bucket) replays the same step without recording it and
    compiles nothing, and the sequences equal CPU's. With the static cache, transformers' compiled
    forward is one node of the captured step from its first call: its graph compiles
    only inside the step's program, never on its own."""
    (first, second), summary = _run(mode, "16,20", "--batch-eos", "--plain")
    assert (summary["captured"], summary["reused"], summary["uncaptured"]) == (1, 1, {}), summary
    if mode == "static":
        assert summary["compiled_programs"] == 0, summary
    # 16 and 20 new tokens: the first comes from the prefill, one replayed step each
    # after it (the EOS row does not stop the batch: max_length does)
    assert summary["replays"] == 15 + 19, summary
    assert first["eos_rows"] == 1 and second["programs"] == 0, (first, second)


@pytest.mark.parametrize("mode", ("strict", "defer_and_fuse"))
def test_captured_decode_stops_at_eos_inside_a_launch(mode):
    """Every row reaches EOS at its 7th new token, inside a launch of several decode steps
    (TPUGraph.replay_steps): the sequences end there, equal to CPU's, and the next call,
    in the same bucket and stopping alike, compiles nothing."""
    (first, second), summary = _run(mode, "24,20", "--all-eos", "--plain")
    assert (summary["captured"], summary["reused"], summary["uncaptured"]) == (1, 1, {}), summary
    assert first["shape"][1] <= 8 + 7 and second["shape"] == first["shape"], (first, second)
    assert second["programs"] == 0, second


@pytest.mark.parametrize("mode", ("strict", "defer_and_fuse"))
@pytest.mark.parametrize("floor", (("--min-new-tokens", "10"), ("--min-length", "19")))
def test_captured_decode_bars_eos_below_a_minimum_length(mode, floor):
    """min_new_tokens / min_length with an EOS the greedy continuation reaches at its 7th
    new token: transformers bars EOS below the length, read from input_ids' shape; the
    captured step bars it with the length as data, so the calls go on past the 7th token
    and stop where CPU's do, captured."""
    (first, second), summary = _run(mode, "24,20", "--all-eos", "--plain", *floor)
    assert (summary["captured"], summary["reused"], summary["uncaptured"]) == (1, 1, {}), summary
    assert first["shape"][1] > 8 + 7, first  # EOS barred at the 7th token
    assert second["programs"] == 0, second


def test_sampled_captured_decode_draws_as_transformers_loop():
    """do_sample with top-k/top-p/temperature, captured: every replay draws what
    transformers' own op-by-op loop draws on tpu from the same seed."""
    (first, second), summary = _run("strict", "20,24", "--sample", "--plain")
    assert (summary["captured"], summary["reused"], summary["uncaptured"]) == (1, 1, {}), summary
    assert second["programs"] == 0, second


def test_scores_and_streamers_decode_op_by_op_and_say_why():
    (first, _), summary = _run("strict", "16,20", "--batch-eos")
    assert summary["captured"] == 0, summary
    assert summary["uncaptured"] == {"scores or logits returned per step": 2}, summary


REUSE_SCRIPT = SCRIPT.parent / "generate_reuse.py"
# each call of generate_reuse.py -> whether it replays the step an earlier call captured
REUSED = {"first": False, "again": True, "parameter updated in place": True,
          "again after the update": True, "suppress_tokens": False,
          "suppress_tokens again": True, "suppress_tokens changed": False,
          "sampling, top_k 1, temperature 0.7": False, "temperature 1.3": False,
          "plain": False, "adapter b": False, "adapter b again": True,
          "adapters disabled": False, "adapter b after": False, "parameter replaced": False,
          "another model": False, "another model again": True, "first model again": True}


@pytest.mark.parametrize("mode", ("strict", "defer_and_fuse"))
def test_captured_step_reused_until_the_model_processors_or_adapter_change(mode):
    """A later call replays the decode step an earlier one captured, without recording it,
    while nothing it was recorded from changed (a parameter updated in place is read by
    the replay); a change of processors, of a processor's number, of the PEFT adapter (set,
    disabled), a replaced parameter or another model records it again. Every call's tokens
    equal CPU's."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REUSE_SCRIPT), mode], capture_output=True,
                          text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    calls = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [c["call"] for c in calls] == list(REUSED), calls
    assert all(c["equal"] for c in calls), calls
    got = {c["call"]: (c["reused"], c["captured"]) for c in calls}
    assert got == {k: (int(r), int(not r)) for k, r in REUSED.items()}, got
