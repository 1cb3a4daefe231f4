"""torch_tpu.jax_op: a JAX function or a Pallas kernel as a torch op on tpu.

The fused Pallas RMSNorm of examples/pallas_rmsnorm.py (forward and backward kernels, its
backward registered with register_autograd) against the same RMSNorm composed from PyTorch
ops: forward and gradients in Strict, Debug and DeferAndFuse and under torch.compile; in
DeferAndFuse the op is a node of the pending graph (counted flushes); it is one node of a
compiled graph; bad input names the op. Then a plain JAX function differentiated by
jax.vjp, the schema read from a signature (tensor lists, tuple results, static
arguments), the CPU kernel, and the example run as a script.
"""
import importlib.util
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import torch

import torch_tpu
from torch_tpu import _tolerances, metrics

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "pallas_rmsnorm.py"
RTOL, ATOL = _tolerances.BY_DTYPE[torch.float32]


def _load_example():
    spec = importlib.util.spec_from_file_location("pallas_rmsnorm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers its two ops: once per process
    return module


ex = _load_example()


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    metrics.reset()
    yield
    torch._dynamo.reset()


def _inputs(device, shape=(2, 8, 32)):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(device).requires_grad_()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(device).requires_grad_()
    ct = torch.randn(*shape, generator=g).to(device)
    return x, w, ct


def _forward_backward(fn, x, w, ct):
    x.grad = w.grad = None
    y = fn(x, w)
    (y * ct).sum().backward()
    return [t.detach().cpu() for t in (y, x.grad, w.grad)]


def _close(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- the Pallas RMSNorm
@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_pallas_rmsnorm_matches_composite_in_every_mode(mode):
    want = _forward_backward(ex.rms_norm_composite, *_inputs("cpu"))
    with torch_tpu.eager_mode(mode):
        got = _forward_backward(ex.rms_norm, *_inputs("tpu"))
        composite = _forward_backward(ex.rms_norm_composite, *_inputs("tpu"))
    _close(got, want)
    _close(got, composite)
    assert metrics.as_dict()["counters"].get(f"dispatches.{mode}", 0) > 0


def test_debug_mode_checks_the_op_against_its_cpu_kernel(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEBUG_CPU_CHECK", "1")
    x, w, _ = _inputs("tpu")
    with torch_tpu.eager_mode("debug"):
        y = ex.rms_norm(x.detach(), w.detach())
    counters = metrics.as_dict()["counters"]
    assert counters["debug.cpu_checks"] >= 1 and not counters.get("debug.cpu_mismatches")
    assert not counters.get("debug.cpu_check_skipped")  # the op has a CPU kernel (JAX on host)
    _close([y.cpu()], [ex.rms_norm_composite(x.detach().cpu(), w.detach().cpu())])


def _flushes():
    return sum(v for k, v in metrics.as_dict()["counters"].items() if k.startswith("flush."))


def test_defer_and_fuse_records_the_op_in_the_pending_graph():
    """Ops before and after the kernel, one read at the end: one flush, one fused graph
    holding them all (the kernel is not a sync point)."""
    x, w, _ = _inputs("tpu")
    x, w = x.detach(), w.detach()
    with torch_tpu.eager_mode("defer_and_fuse"):
        torch_tpu.sync()
        metrics.reset()
        h = (x * 2).tanh()
        y = ex.rms_norm(h, w) + 1
        total = y.sum().item()
    counters = metrics.as_dict()["counters"]
    assert _flushes() == 1 and counters["flush.item"] == 1
    assert counters["fused_nodes"] >= 4  # mul, tanh, the kernel, add, sum
    want = (ex.rms_norm_composite((x.cpu() * 2).tanh(), w.cpu()) + 1).sum().item()
    assert total == pytest.approx(want, rel=RTOL)


def test_defer_and_fuse_training_step_flushes_as_the_composite_does():
    def step(fn):
        x, w, ct = _inputs("tpu")
        with torch_tpu.eager_mode("defer_and_fuse"):
            torch_tpu.sync()
            metrics.reset()
            _forward_backward(fn, x, w, ct)
            return _flushes()

    assert step(ex.rms_norm) == step(ex.rms_norm_composite)


@pytest.mark.parametrize("how", ["default", "tpu"])
def test_pallas_rmsnorm_under_torch_compile(how):
    fn = torch.compile(ex.rms_norm, fullgraph=True) if how == "default" else \
        torch.compile(ex.rms_norm, backend="tpu", fullgraph=True)
    want = _forward_backward(ex.rms_norm_composite, *_inputs("cpu"))
    _close(_forward_backward(fn, *_inputs("tpu")), want)
    counters = metrics.as_dict()["counters"]
    assert counters["compile.dynamo_graphs"] == 1  # fullgraph: no break around the kernel
    assert counters["compile.graphs"] == 2  # forward, backward: each one program
    assert not counters.get("compile.eager_graphs")  # every node lowered, the kernels too


def test_the_op_is_one_node_of_the_dynamo_graph():
    x, w, _ = _inputs("tpu")
    explained = torch._dynamo.explain(ex.rms_norm)(x, w)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    targets = [str(n.target) for n in explained.graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("rms_norm_fwd" in t for t in targets) == 1, targets


def test_bad_input_names_the_op():
    x, w, _ = _inputs("tpu")
    with pytest.raises(RuntimeError, match=r"pallas_example::rms_norm_fwd.*weight must have"):
        ex.rms_norm(x, w[:-1])
    with pytest.raises(RuntimeError, match=r"pallas_example::rms_norm_fwd.*floating input"):
        ex.rms_norm(torch.ones(2, 32, dtype=torch.int32, device="tpu"), w)
    with pytest.raises(Exception, match=r"pallas_example::rms_norm_fwd.*weight must have"):
        torch.compile(ex.rms_norm, backend="tpu")(x, w[:-1])


# ---------------------------------------------------------------- a JAX function
def _swiglu(x: jax.Array, w: jax.Array, alpha: float = 1.0) -> jax.Array:
    a, b = jnp.split(x @ w, 2, axis=-1)
    return jax.nn.silu(a) * b * alpha


swiglu = torch_tpu.jax_op("jax_op_test::swiglu", _swiglu, static_argnames=("alpha",))


def _swiglu_composite(x, w, alpha=1.0):
    a, b = (x @ w).chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b * alpha


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
def test_backward_derived_with_jax_vjp(mode):
    def run(device, fn):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(4, 8, generator=g).to(device).requires_grad_()
        w = torch.randn(8, 6, generator=g).to(device).requires_grad_()
        y = fn(x, w, 0.5)
        y.square().sum().backward()
        return [t.detach().cpu() for t in (y, x.grad, w.grad)]

    want = run("cpu", _swiglu_composite)
    if mode == "compile":
        got = run("tpu", torch.compile(swiglu, backend="tpu", fullgraph=True))
        assert not metrics.as_dict()["counters"].get("compile.eager_graphs")
    else:
        with torch_tpu.eager_mode(mode):
            got = run("tpu", swiglu)
    _close(got, want)
    _close(run("cpu", swiglu), want)  # the CPU kernel (and its vjp) too


def _mix(xs: list[jax.Array], scale: jax.Array, bias: jax.Array = None,
         power: int = 2) -> tuple[jax.Array, jax.Array]:
    total = sum(x ** power for x in xs) * scale
    return total + (0 if bias is None else bias), jnp.stack(xs).argmax(axis=0)


def test_schema_from_the_signature():
    mix = torch_tpu.jax_op("jax_op_test::mix", _mix, static_argnames=["power"])
    assert str(mix._opoverload._schema) == (
        "jax_op_test::mix(Tensor[] xs, Tensor scale, Tensor? bias=None, int power=2) "
        "-> (Tensor, Tensor)")
    xs = [torch.randn(3, 5) for _ in range(3)]
    scale, bias = torch.tensor(0.5), torch.randn(5)
    for kwargs in ({}, {"bias": bias, "power": 3}):
        want = mix(xs, scale, **kwargs)  # the CPU kernel: JAX on the host
        got = mix([x.to("tpu") for x in xs], scale.to("tpu"),
                  **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v
                     for k, v in kwargs.items()})
        assert got[0].device.type == "tpu" and got[1].dtype == torch.int64
        _close([g.cpu() for g in got], want)
    p = kwargs["power"]
    torch.testing.assert_close(want[0], sum(x ** p for x in xs) * scale + bias)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_torch_library_opcheck(device):
    """torch's own consistency checks of a custom op: schema, fake implementation against
    the kernel, AOT dispatch (dynamic shapes too), autograd registration. The last checks
    CPU/CUDA/XPU inputs only ("NYI devices other than CPU/CUDA/XPU"), so on CPU."""
    checks = [u for u in torch.library._OPCHECK_DEFAULT_UTILS
              if device == "cpu" or u != "test_autograd_registration"]
    x, w, _ = _inputs(device)
    a = torch.randn(4, 8, device=device, requires_grad=True)
    b = torch.randn(8, 6, device=device, requires_grad=True)
    for op, args in ((ex.rms_norm_fwd, (x, w, 1e-6)), (swiglu, (a, b, 0.5))):
        result = torch.library.opcheck(op, args, test_utils=checks)
        assert set(result.values()) == {"SUCCESS"}, result


def test_reference_spelling_and_a_clear_error_for_untyped_statics():
    from torch_tpu._internal import pallas

    assert pallas.jax_op is torch_tpu.jax_op
    with pytest.raises(TypeError, match=r"jax_op_test::bad: static argument 'k' needs a type"):
        torch_tpu.jax_op("jax_op_test::bad", lambda x, k: x * k, static_argnames=("k",))


def test_a_result_count_that_differs_from_the_annotation_is_named():
    two = torch_tpu.jax_op("jax_op_test::two", lambda x: (x, x + 1))
    with pytest.raises(RuntimeError, match=r"jax_op_test::two.*returns 2 array\(s\)"):
        two(torch.ones(3, device="tpu"))


# ---------------------------------------------------------------- the example, as a user runs it
@pytest.mark.slow
def test_example_runs_as_a_script():
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "torch.compile" in proc.stdout and "RMSNorm module output (4, 16, 64)" in proc.stdout
