"""Activation offload to host memory: `torch.autograd.graph.save_on_cpu(pin_memory=True)`
moves saved activations to the host in each eager mode (device memory held between forward
and backward drops, gradients unchanged), torch's `torch.ops.ao.offload / reload /
wait_tensor` move tensors and free the source as on CUDA, and AOTAutograd's activation
offloading (torch._functorch.config.enable_activation_offloading, synchronous or on a
separate stream) runs inside the compiled programs, not eagerly."""
import contextlib

import pytest
import torch
import torch._functorch.config as functorch_config
import torch.nn as nn

import torch_tpu
from torch_tpu import metrics

MiB = 2**20


def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(6)])


def _step(model, x, ctx, device, step=None, peaks=None):
    """-> (device bytes held after forward, loss, gradients on the host); `peaks` gets
    the step's peak device bytes over what was allocated before it."""
    model = model.to(device)
    for p in model.parameters():
        p.grad = None
    x = x.to(device)
    torch_tpu.sync()
    before = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    with ctx():
        loss = (step or model)(x).square().mean()
    torch_tpu.sync()
    held = torch.tpu.memory_allocated() - before
    loss.backward()
    torch_tpu.sync()
    if peaks is not None:
        peaks.append(torch.tpu.max_memory_allocated() - before)
    return held, loss.item(), [p.grad.cpu() for p in model.parameters()]


def _cpu_reference(x):
    m = _model()
    loss = m(x).square().mean()
    loss.backward()
    return loss.item(), [p.grad for p in m.parameters()]


@pytest.mark.parametrize("device_type", ["cuda", "tpu"])
def test_save_on_cpu_lowers_held_memory_same_gradients(eager, device_type):
    x = torch.randn(512, 256)
    want_loss, want_grads = _cpu_reference(x)
    peaks = []
    plain, loss, grads = _step(_model(), x, contextlib.nullcontext, "tpu", peaks=peaks)
    offloaded, loss_off, grads_off = _step(
        _model(), x, lambda: torch.autograd.graph.save_on_cpu(pin_memory=True,
                                                              device_type=device_type), "tpu",
        peaks=peaks)
    assert plain > 6 * MiB           # 12 activations of 512 x 256 floats stay for backward
    assert offloaded < plain / 4     # on the host instead
    assert peaks[1] < peaks[0] * 0.75, peaks  # and the step's peak falls with them
    for got_loss, got in ((loss, grads), (loss_off, grads_off)):
        assert got_loss == pytest.approx(want_loss, rel=1e-5)
        for g, w in zip(got, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_ao_offload_and_reload_free_the_source(eager):
    x = torch.randn(128, 256).to("tpu") * 3
    want = x.cpu()
    host = torch.ops.ao.offload(x)
    host = torch.ops.ao.wait_tensor(host, keepalive=x)
    assert host.device.type == "cpu" and host.is_pinned() and torch.equal(host, want)
    assert x.untyped_storage().size() == 0          # the device copy is freed, as on CUDA
    back = torch.ops.ao.reload(host, torch.device("tpu:0"))
    back = torch.ops.ao.wait_tensor(back, keepalive=host)
    assert back.device.type == "tpu" and torch.equal(back.cpu(), want)
    assert host.untyped_storage().size() == 0       # and the host copy after the reload


def test_uploaded_host_tensor_stays_resizable(eager):
    x = torch.randn(4)
    y = x.to("tpu")
    x.resize_(100)  # an upload must not lock the user's storage (numpy() would)
    assert torch.equal(y.cpu(), x[:4])


def _mark_activations(gm, joint_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.name.startswith(("addmm", "gelu")):
            node.meta["should_offload"] = True
    return gm


@pytest.mark.parametrize("separate_stream", [False, True], ids=["device_put", "ao_ops"])
def test_compiled_activation_offloading_runs_in_the_programs(separate_stream):
    x = torch.randn(512, 256)
    want_loss, want_grads = _cpu_reference(x)
    results = {}
    for offload in (False, True):
        torch._dynamo.reset()
        model = _model().to("tpu")
        step = torch.compile(model, backend="tpu")
        before = metrics.counters.copy()
        with functorch_config.patch(enable_activation_offloading=offload,
                                    joint_custom_pass=_mark_activations if offload else None,
                                    activation_offload_separate_stream=separate_stream):
            results[offload] = _step(model, x, contextlib.nullcontext, "tpu", step)
        grew = metrics.counters - before
        assert grew["compile.graphs"] == 2 and not grew["compile.eager_graphs"], dict(grew)
    (plain, _, _), (offloaded, loss, grads) = results[False], results[True]
    assert offloaded < plain / 2
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
