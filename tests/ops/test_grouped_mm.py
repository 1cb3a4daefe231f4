"""torch._grouped_mm (F.grouped_mm), the product of transformers' mixture-of-experts
layers, in its four forms, against CPU's kernel, in each eager mode and compiled; its
gradients; and that it reads nothing back to the host (ATen's composite kernel, which ran
before the lowering, read `offs` and ran one mm per group)."""
import pytest
import torch

from torch_tpu import metrics

OFFS = [5, 9, 9, 30]  # an empty group, and rows past the last offset


def _forms(g):
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    offs = torch.tensor(OFFS, dtype=torch.int32)
    return {"2d-3d": (r(32, 16), r(4, 16, 8), offs), "3d-2d": (r(4, 6, 16), r(16, 32), offs),
            "2d-2d": (r(6, 32), r(32, 8), offs), "3d-3d": (r(4, 6, 16), r(4, 16, 8), None)}


def _valid(name, out, of="out"):
    """What lies past the last offset is undefined (CUDA's kernel leaves it unwritten; so
    does CPU's, whose gradients there are uninitialized memory): the result's rows (2d-3d)
    or columns (3d-2d) there, and the gradients there (2d-2d: along the grouped K)."""
    if (name, of) in (("2d-3d", "out"), ("2d-3d", "a"), ("2d-2d", "b")):
        return out[:OFFS[-1]]
    if (name, of) in (("3d-2d", "out"), ("3d-2d", "b"), ("2d-2d", "a")):
        return out[..., :OFFS[-1]]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("form", ["2d-3d", "3d-2d", "2d-2d", "3d-3d"])
def test_grouped_mm_matches_cpu_with_gradients(eager, form, dtype):
    a, b, offs = _forms(torch.Generator().manual_seed(0))[form]
    a, b = a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()
    want = torch._grouped_mm(a, b, offs=offs)
    _valid(form, want).float().square().sum().backward()
    at, bt = (x.detach().to("tpu").requires_grad_() for x in (a, b))
    reads = metrics.counters["device_to_host"]
    got = torch._grouped_mm(at, bt, offs=None if offs is None else offs.to("tpu"))
    _valid(form, got).float().square().sum().backward()
    assert metrics.counters["device_to_host"] == reads  # no host read of offs
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(_valid(form, got).cpu(), _valid(form, want), **tol)
    torch.testing.assert_close(_valid(form, at.grad.cpu(), "a"), _valid(form, a.grad, "a"), **tol)
    torch.testing.assert_close(_valid(form, bt.grad.cpu(), "b"), _valid(form, b.grad, "b"), **tol)


@pytest.mark.slow  # dynamo and two XLA compiles
def test_compiled_grouped_mm_is_one_graph_in_float32():
    """transformers calls grouped_mm on tpu in float32 under torch.compile: torch's meta
    function (CUDA's checks: bfloat16 only) refused the graph before compile/fakes.py."""
    import torch._dynamo

    torch._dynamo.reset()
    a, b, offs = _forms(torch.Generator().manual_seed(1))["2d-3d"]
    fn = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o).relu(), backend="tpu",
                       fullgraph=True)
    before = metrics.counters["compile.eager_graphs"]
    got = fn(a.to("tpu"), b.to("tpu"), offs.to("tpu")).cpu()
    assert metrics.counters["compile.eager_graphs"] == before
    torch.testing.assert_close(got[:OFFS[-1]], torch._grouped_mm(a, b, offs=offs).relu()[:OFFS[-1]])
