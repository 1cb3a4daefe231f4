"""A Llama whose rotary embedding is written in complex numbers (Meta's original model.py,
torchtitan's) compiles on tpu into XLA programs with no graph left to run eagerly, and
trains as the same script does on CPU (tests/user_code/llama_complex_rope.py, written for
CUDA, `cuda` -> `tpu` the only edit)."""
import pathlib

import pytest
import torch
from helpers.dist_launch import report_counter, run_single, swap_cuda

from torch_tpu import _tolerances

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "llama_complex_rope.py"
RTOL, _ = _tolerances.BY_DTYPE[torch.float32]


@pytest.mark.slow
def test_complex_rotary_llama_compiles_whole_and_trains_as_on_cpu(tmp_path):
    want, _ = run_single(SCRIPT, {"FORCE_CPU": "1", "COMPILE": "0"})
    got, out = run_single(swap_cuda(SCRIPT, tmp_path / "llama_tpu.py"), {"TORCH_TPU_METRICS": "1"})
    assert got["device"] == "tpu:0"
    assert got["losses"] == pytest.approx(want["losses"], rel=RTOL)
    assert got["losses"][-1] < got["losses"][0]
    assert report_counter(out, "compile.graphs") >= 2, out[-3000:]  # forward and backward
    assert report_counter(out, "compile.eager_graphs") == 0, out[-3000:]
    assert "runs eagerly" not in out


def test_complex_views_as_ops(tpu):
    """The functional twins the compiled graph uses, called as ops, match CPU."""
    x = torch.randn(3, 4, 2)
    z = torch.view_as_complex_copy(x)
    for got, want in [(torch.view_as_complex_copy(x.to(tpu)), z),
                      (torch.view_as_real_copy(z.to(tpu)), torch.view_as_real_copy(z)),
                      (torch._conj_copy(z.to(tpu)), torch._conj_copy(z))]:
        torch.testing.assert_close(got.cpu(), want)
