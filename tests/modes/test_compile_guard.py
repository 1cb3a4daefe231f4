"""DeferAndFuse's compile-cost guard (eager/defer.py): an unrolled loop's repeated blocks
are flushed as one cached program each, instead of one graph that compiles every step.

PyTorch's word-language-model LSTM (tests/user_code/lstm_lm.py: 2 layers, bptt 35), run as
written for CUDA with only the device string swapped, in a fresh process with an empty
compile cache, beside the same script on CPU for the reference losses. Counted in
programs (stable, unlike times); the first step's time is printed, not asserted."""
import pathlib

import pytest
import torch
from helpers.dist_launch import run_script, swap_cuda

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "lstm_lm.py"
STEPS = "3"


@pytest.mark.slow
def test_unrolled_lstm_compiles_its_repeated_blocks_once(tmp_path):
    env = {"STEPS": STEPS}
    code, out, res = run_script(SCRIPT, env={**env, "FORCE_CPU": "1"}, timeout=400)
    assert code == 0 and res, out[-4000:]
    cpu = res[0]
    code, out, res = run_script(
        swap_cuda(SCRIPT, tmp_path / "lstm_lm_tpu.py"), timeout=900,
        env={**env, "TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_CACHE_DIR": str(tmp_path / "xla")})
    assert code == 0 and res, out[-4000:]
    got = res[0]
    first = got["counters"][0]
    print(f"\nLSTM LM, first DeferAndFuse step: {got['seconds'][0]:.1f} s, "
          f"{first['fused_graphs_compiled']} graphs compiled of {first['graph_nodes']} nodes "
          f"({first['fused_nodes']} nodes flushed), compile_seconds "
          f"{first['compile_seconds']:.1f}; warm steps {got['seconds'][2:]} s")
    # One graph per sync point would be two (forward 233 ops, backward and update 715),
    # compiling all 70 cell steps of each. Split, each repeated block is one program:
    # 11 graphs of 10-88 nodes, a third of the step's nodes (bounds with some slack).
    assert first["flush.compile_guard"] > 0, first
    assert first["fused_graphs_compiled"] <= 16, first
    assert max(first["graph_nodes"]) <= 128, first
    assert sum(first["graph_nodes"]) <= first["fused_nodes"] // 2, first
    # the second step's first graphs read the carried hidden state (the first step's
    # were zeros): a few programs more, then nothing
    assert got["counters"][2]["fused_graphs_compiled"] == got["counters"][1]["fused_graphs_compiled"]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(cpu["losses"]),
                               rtol=1e-5, atol=1e-5)
