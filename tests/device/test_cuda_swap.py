"""The literal swap: a training script written for CUDA (tests/user_code/cuda_train.py), with
every `cuda` replaced by `tpu` and every `nccl` by `tpu_dist` and nothing else, runs and
trains as the same script does on CPU, in one process and under torchrun (DDP). Then the
torch.cuda names such scripts reach, one by one: GradScaler and its two kernels, tpu's
autocast, timing events and streams, torch.backends.tpu / tpudnn, pinned copies.
"""
import pathlib
import time

import pytest
import torch

import torch_tpu
from torch_tpu import metrics

from helpers.dist_launch import run_script, swap_cuda

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "cuda_train.py"

# The loss tolerances against CPU autocast. Both runs compute in bfloat16 (the script's
# autocast dtype on either device), but not the same ops: tpu's autocast follows CUDA's op
# lists, where cross_entropy's log_softmax keeps the bfloat16 it is given, so each
# sample's loss is rounded to bfloat16 (relative error up to 2**-8, and the loss is their
# weighted mean), while CPU's list runs all of cross_entropy in float32. Convolutions and
# products also accumulate in another order before their bfloat16 rounding.
# - The first step is one forward from the same weights and data: 2**-8 (measured: 8e-4).
# - Later steps carry the gap through training, where AdamW's normalized steps move a
#   weight by up to lr whatever its gradient's size, so a rounding that flips a small
#   gradient's sign is not damped: measured up to 3.3e-3 over the script's 16 steps
#   (one process and two); held to one bfloat16 epsilon, 2**-7.
FIRST_LOSS_RTOL = 2.0**-8
LOSS_RTOL = torch.finfo(torch.bfloat16).eps


# ---------------------------------------------------------------- the script, swapped
def _swapped(tmp_path) -> pathlib.Path:
    assert "nccl" in SCRIPT.read_text()  # written for CUDA, the strings literal
    return pathlib.Path(swap_cuda(SCRIPT, tmp_path / "tpu_train.py"))


def _run(script, env=None, nproc=None, timeout=600) -> list:
    """Run `script` (under torchrun with `nproc` processes when given); its RESULT lines,
    sorted by rank."""
    code, out, results = run_script(script, env, nproc, timeout)
    assert code == 0, out[-8000:]
    assert len(results) == (nproc or 1), out[-8000:]
    return results


def _check_against_cpu(got, want, device):
    assert got["device"] == device, got
    assert got["losses"][0] == pytest.approx(want["losses"][0], rel=FIRST_LOSS_RTOL)
    assert got["losses"] == pytest.approx(want["losses"], rel=LOSS_RTOL), (got, want)
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=LOSS_RTOL)
    first, last = got["losses"][:4], got["losses"][-4:]
    assert sum(last) < sum(first) - 4 * 0.1, got["losses"]  # it trains
    assert got["eval_dtype"] == want["eval_dtype"] == "torch.bfloat16"  # autocast's default
    assert got["scale"] == 2.0**16  # GradScaler ran: enabled, no inf in bfloat16
    assert all(ms > 0 for ms in got["step_ms"])  # tpu events timed each step
    assert got["max_mem_mb"] > 0.1  # the parameters, Adam's state and the activations


@pytest.mark.slow  # the script trains on CPU and on tpu, in fresh processes
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_swapped_script_trains_as_on_cpu(tmp_path, mode):
    want, = _run(SCRIPT, {"FORCE_CPU": "1"})
    env = {"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "defer" else {}
    got, = _run(_swapped(tmp_path), env)
    _check_against_cpu(got, want, "tpu:0")


@pytest.mark.distributed
def test_swapped_script_under_torchrun_trains_as_gloo_on_cpu(tmp_path):
    want = _run(SCRIPT, {"FORCE_CPU": "1"}, nproc=2)
    got = _run(_swapped(tmp_path), nproc=2)
    for rank in range(2):
        _check_against_cpu(got[rank], want[rank], f"tpu:{rank}")
    assert got[0]["params"] == got[1]["params"]  # DDP kept the replicas identical


# ---------------------------------------------------------------- GradScaler's kernels
def _unscale(device, grads, found_inf, inv_scale):
    grads = [g.to(device, copy=True) for g in grads]
    found = torch.tensor(found_inf, device=device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found,
                                                     torch.tensor(inv_scale, device=device))
    return [g.cpu() for g in grads], found.item()


@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("found_before", [0.0, 1.0])
def test_amp_non_finite_check_and_unscale_matches_cpu(eager, bad, found_before):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g) * 2**16, torch.randn(7, generator=g).half(),
             torch.randn(4, 4, generator=g).bfloat16(), torch.randn(3, generator=g).double()]
    if bad is not None:
        grads[2][1, 2] = bad
    for inv_scale in (2.0**-16, 1.0):
        want = _unscale("cpu", grads, found_before, inv_scale)
        got = _unscale("tpu", grads, found_before, inv_scale)
        assert got[1] == want[1] == (0.0 if bad is None and not found_before else 1.0)
        for a, b in zip(got[0], want[0]):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # and dtype


def _update(device, scale, tracker, found_inf, interval):
    s = torch.tensor(scale, dtype=torch.float32, device=device)
    t = torch.tensor(tracker, dtype=torch.int32, device=device)
    out = torch._amp_update_scale_(s, t, torch.tensor(found_inf, device=device), 2.0, 0.5,
                                   interval)
    assert out is s
    return s.item(), t.item()


@pytest.mark.parametrize("scale,tracker,found_inf", [
    (2.0**16, 0, 0.0),     # a clean step: the tracker counts it
    (2.0**16, 2, 0.0),     # the third clean step in a row: the scale grows
    (2.0**16, 1, 1.0),     # an inf: back off, restart the count
    (3.0e38, 2, 0.0),      # growing would overflow float32: the scale stays
    (1.5, 0, 1.0),
])
def test_amp_update_scale_matches_cpu(eager, scale, tracker, found_inf):
    assert _update("tpu", scale, tracker, found_inf, 3) == \
        _update("cpu", scale, tracker, found_inf, 3)


def _scaled_training(device, fused, steps=5, inf_at=(1, 3)):
    """A few GradScaler steps with an inf injected into one grad at `inf_at`: the params
    after each step, the scale after each update."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler(device.split(":")[0], init_scale=2.0**10, growth_interval=2)
    g = torch.Generator().manual_seed(1)
    trace = []
    for step in range(steps):
        x = torch.randn(4, 6, generator=g).to(device)
        loss = model(x).square().mean()
        scaler.scale(loss).backward()
        if step in inf_at:
            with torch.no_grad():
                model[2].weight.grad[0, 1] = float("inf")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        trace.append(([p.detach().cpu().clone() for p in model.parameters()], scaler.get_scale()))
    return trace


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_grad_scaler_skips_steps_with_inf_and_matches_cpu(eager, fused):
    want = _scaled_training("cpu", fused)
    got = _scaled_training("tpu", fused)
    scales = [s for _, s in got]
    # growth_interval 2: clean, inf (halve), clean, inf (halve), clean
    assert scales == [s for _, s in want] == [2.0**10, 2.0**9, 2.0**9, 2.0**8, 2.0**8]
    for step in (1, 3):  # skipped: the params are those of the step before
        assert all(torch.equal(a, b) for a, b in zip(got[step][0], got[step - 1][0]))
    for (params, _), (ref, _) in zip(got, want):
        for a, b in zip(params, ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- torch.tpu.amp
def test_tpu_amp_names():
    from torch.tpu.amp import GradScaler, autocast, custom_bwd, custom_fwd

    a = torch.randn(4, 4, device="tpu")
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    with torch.autocast("tpu"):
        assert (a @ a).dtype == torch.bfloat16
    with autocast():
        assert (a @ a).dtype == torch.bfloat16
    with autocast(dtype=torch.float16):
        assert (a @ a).dtype == torch.float16
    with autocast(enabled=False):
        assert (a @ a).dtype == torch.float32
    assert GradScaler()._device == "tpu" and GradScaler(enabled=False).is_enabled() is False

    class Square(torch.autograd.Function):
        @staticmethod
        @custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x @ x

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad @ x.T + x.T @ grad

    x = torch.randn(4, 4, device="tpu", dtype=torch.bfloat16, requires_grad=True)
    with autocast():
        y = Square.apply(x)
    assert y.dtype == torch.float32  # cast_inputs ran the forward in float32
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16


# ---------------------------------------------------------------- events and streams
def test_timing_events():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="must be recorded"):
        start.elapsed_time(end)
    start.record()
    time.sleep(0.05)
    x = torch.randn(256, 256, device="tpu")
    for _ in range(3):
        x = torch.tanh(x @ x)
    end.record()
    end.synchronize()
    assert end.query()
    assert 50 <= start.elapsed_time(end) < 60_000
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        torch.tpu.Event().elapsed_time(end)


def test_timing_event_runs_deferred_work_and_plain_events_do_not():
    with torch_tpu.eager_mode("defer_and_fuse"):
        x = torch.ones(8, device="tpu") * 2
        before = metrics.counters.copy()
        torch.tpu.Event().record()  # FSDP2's ordering events: no flush, no wait
        torch.tpu.current_stream().record_event()
        assert not [k for k in metrics.counters - before if k.startswith("flush.")]
        torch.tpu.Event(enable_timing=True).record()  # the work before it must be done
        assert [k for k in metrics.counters - before if k.startswith("flush.")]
        assert x.cpu().tolist() == [2.0] * 8


def test_streams_for_prefetching_code():
    side = torch.tpu.Stream()
    src = torch.arange(6.0).pin_memory()
    with torch.tpu.stream(side):
        y = src.to("tpu", non_blocking=True)
    torch.tpu.current_stream().wait_stream(side)
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    event = side.record_event()
    torch.tpu.current_stream().wait_event(event)
    side.synchronize()
    assert y.cpu().tolist() == src.tolist()


# ---------------------------------------------------------------- torch.backends
def test_backends_tpu_matmul_allow_tf32_is_the_float32_matmul_precision():
    import torch.backends.tpu

    matmul = torch.backends.tpu.matmul
    before = torch.get_float32_matmul_precision()
    try:
        matmul.allow_tf32 = True
        assert torch.get_float32_matmul_precision() == "high" and matmul.allow_tf32
        assert matmul.fp32_precision == "tf32"
        matmul.allow_tf32 = False
        assert torch.get_float32_matmul_precision() == "highest" and not matmul.allow_tf32
        matmul.fp32_precision = "bf16"
        assert torch.get_float32_matmul_precision() == "medium"
        with pytest.raises(ValueError, match="fp32_precision"):
            matmul.fp32_precision = "fp8"
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.backends.tpu.is_built()
    torch.backends.tpu.enable_flash_sdp(True)  # torch's process-wide flag; no effect on tpu


def test_backends_tpudnn_flags_are_stored_and_restored():
    import torch.backends.tpudnn as tpudnn

    assert tpudnn is torch.backends.tpudnn
    assert not tpudnn.is_available() and tpudnn.version() is None
    for name in ("enabled", "benchmark", "deterministic", "allow_tf32"):  # cuDNN's defaults
        assert getattr(tpudnn, name) == getattr(torch.backends.cudnn, name), name
    tpudnn.benchmark = True
    try:
        with tpudnn.flags(enabled=False, deterministic=True):
            assert not tpudnn.enabled and tpudnn.deterministic and not tpudnn.benchmark
        assert tpudnn.enabled and not tpudnn.deterministic and tpudnn.benchmark
    finally:
        tpudnn.benchmark = False


# ---------------------------------------------------------------- pinned copies
def test_pinned_non_blocking_copies_both_ways(eager):
    x = torch.randn(1000)
    y = x.pin_memory().to("tpu", non_blocking=True) * 2
    back = y.to("cpu", non_blocking=True)  # as on CUDA: a pinned tensor, valid after a sync
    buf = torch.empty(1000, pin_memory=True)
    buf.copy_(y, non_blocking=True)
    torch.tpu.synchronize()
    assert back.is_pinned() and torch.equal(back, x * 2) and torch.equal(buf, x * 2)
