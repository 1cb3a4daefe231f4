"""`torch.compile(model)` with no arguments on tpu tensors, as public training scripts call it.

A nanoGPT-style script written for CUDA (tests/user_code/nanogpt_compile.py), with `cuda`
swapped for `tpu` and nothing else, compiles its model, trains, runs the compiled model
for inference and samples, matching the same script run eagerly on CPU. Then, in process:
mode/options are reported as unused, a compiled optimizer step keeps its state on the
device, and graphs on CPU tensors still go to inductor. docs/COMPILE.md says how and why.
"""
import pathlib
import warnings

import pytest
import torch
from helpers.dist_launch import report_counter, run_single, swap_cuda

from torch_tpu import _tolerances, metrics

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "nanogpt_compile.py"
RTOL, ATOL = _tolerances.BY_DTYPE[torch.float32]


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    metrics.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_nanogpt_script_compiles_trains_and_samples_as_on_cpu(tmp_path):
    text = SCRIPT.read_text()
    assert "model = torch.compile(model)" in text and "cuda" in text  # as written for CUDA
    want, _ = run_single(SCRIPT, {"FORCE_CPU": "1", "COMPILE": "0"})
    got, out = run_single(swap_cuda(SCRIPT, tmp_path / "nanogpt_tpu.py"), {"TORCH_TPU_METRICS": "1"})
    assert got["device"] == got["sample_device"] == "tpu:0"
    assert got["losses"] == pytest.approx(want["losses"], rel=RTOL)
    assert got["losses"][-1] < got["losses"][0] - 0.2  # it trains
    torch.testing.assert_close(torch.tensor(got["last_logits"]), torch.tensor(want["last_logits"]),
                               rtol=RTOL, atol=ATOL)
    assert got["sample"] == want["sample"]
    # the compiled graphs ran as XLA programs: training forward and backward, inference
    assert report_counter(out, "compile.graphs") >= 3, out[-3000:]
    assert report_counter(out, "compile.eager_graphs") == 0
    assert "InductorError" not in out


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_mode_and_options_are_named_as_unused_on_tpu():
    model = _mlp().to("tpu")
    x = torch.randn(3, 8, device="tpu")
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = compiled(x)
    assert any("does not read them" in str(w.message) and "max_autotune" in str(w.message)
               for w in caught), \
        [str(w.message) for w in caught]
    torch.testing.assert_close(y.cpu(), _mlp()(x.cpu()), rtol=RTOL, atol=ATOL)
    # the forward, and its backward: handed over with it to compile ahead (docs/COMPILE.md)
    assert metrics.as_dict()["counters"]["compile.graphs"] == 2


def test_compiled_optimizer_step_keeps_its_state_on_the_device():
    """torch.compile readies dynamo for tpu before its first trace, so a compiled optimizer
    step, the first thing compiled, finds its param groups capturable (as on CUDA)."""
    model = _mlp().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 8, device="tpu")).sum().backward()

    @torch.compile
    def step():
        opt.step()

    step()
    assert all(group["capturable"] for group in opt.param_groups)
    assert all(s["step"].device.type == "tpu" for s in opt.state.values())


def test_graphs_on_cpu_tensors_still_go_to_inductor(monkeypatch):
    """Only graphs that compute on tpu change hands; inductor itself is stubbed here (a
    CPU compile builds C++, minutes on this machine)."""
    import torch._inductor.compile_fx as inductor

    seen = []

    def compile_fx(gm, example_inputs, **kwargs):
        seen.append([x.device.type for x in example_inputs])
        return gm.forward

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)

    def f(x):
        return (x.sin() + 1).relu()

    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(f)(x), f(x))
    assert seen == [["cpu"]]
    assert not metrics.as_dict()["counters"].get("compile.dynamo_graphs")
    y = torch.compile(f)(x.to("tpu"))
    assert seen == [["cpu"]] and metrics.as_dict()["counters"]["compile.dynamo_graphs"] == 1
    torch.testing.assert_close(y.cpu(), f(x), rtol=RTOL, atol=ATOL)
