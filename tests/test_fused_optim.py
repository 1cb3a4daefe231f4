"""torch.optim's fused Adam, AdamW and SGD (fused=True) on tpu, as a training script uses them.

Each step is one program for the whole parameter list (`_fused_adam_`, `_fused_adamw_`,
`_fused_sgd_`, lowering/optim.py). Its values are the foreach path's (foreach=True, the
default on tpu) to within 1 ulp, in Strict and Debug and under DeferAndFuse, and close to
CPU's fused kernels. Also covered: capturable, a tensor learning rate, a schedule that
changes lr every step (no recompile), GradScaler's grad_scale/found_inf, bf16 parameters,
and torch.compile(backend="tpu") of the step and of the functional ops in a graph.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import compile as tpu_compile
from torch_tpu import metrics

tpu_compile.register()  # idempotent


class Net(torch.nn.Module):
    """Two Linear layers, a 0-dim parameter, and a parameter that never gets a grad."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 3)
        self.temperature = torch.nn.Parameter(torch.tensor(1.5))
        self.unused = torch.nn.Parameter(torch.randn(5, 2))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) / self.temperature


OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw-amsgrad-maximize": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.99),
                                                       weight_decay=0.1, amsgrad=True,
                                                       maximize=True)),
    "adam-l2": (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
    "adam-amsgrad": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, eps=1e-6)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd-nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True,
                                           weight_decay=0.1)),
    "sgd-dampening-maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3,
                                                     weight_decay=0.05, maximize=True)),
}
# DeferAndFuse compiles a graph per distinct step: one Adam and one SGD keep the file fast
DEFER_OPTIMIZERS = ["adamw-amsgrad-maximize", "sgd-nesterov"]
CASES = ([(m, o) for m in ("strict", "debug") for o in OPTIMIZERS]
         + [("defer_and_fuse", o) for o in DEFER_OPTIMIZERS])


def train(device, name, steps=3, step_fn=None, dtype=torch.float32, **impl):
    """A few steps of a small regression; the parameters and the optimizer state after."""
    cls, kwargs = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = Net().to(device, dtype)
    opt = cls(model.parameters(), **kwargs, **impl)
    step = step_fn(opt) if step_fn else opt.step
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g).to(device, dtype)
        y = torch.randn(8, 3, generator=g).to(device, dtype)
        F.mse_loss(model(x).float(), y.float()).backward()
        step()
        opt.zero_grad()
    return _values(model, opt)


def _values(model, opt):
    out = [p.detach().cpu() for p in model.parameters()]
    for p in model.parameters():
        state = opt.state.get(p, {})
        out.extend(state[k].detach().cpu().to(p.dtype) for k in sorted(state))
    return out


def max_ulps(got, want) -> float:
    """The largest distance between two lists of tensors, in units in the last place of
    `want` (0: bit-for-bit)."""
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.numel() == 0 or torch.equal(a, b):
            continue
        ulp = (torch.nextafter(b, torch.full_like(b, math.inf)) - b).double()
        worst = max(worst, ((a.double() - b.double()).abs() / ulp).max().item())
    return worst


def assert_close_to_cpu(got, want):
    """CPU's fused kernels write the same update in another order (a hand-rolled lerp,
    bias corrections in another precision): equal to a few float32 ulps."""
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-7)


# ---------------------------------------------------------------- parity
@pytest.mark.parametrize("mode,name", CASES)
def test_fused_matches_foreach(mode, name):
    with torch_tpu.eager_mode(mode):
        fused = train("tpu", name, fused=True)
        foreach = train("tpu", name, foreach=True)
    if mode == "defer_and_fuse":
        # DeferAndFuse runs the foreach ops as one program, and XLA contracts a product
        # and the add after it into one FMA there: one rounding fewer than the ops round
        # on their own, so its foreach is itself no longer Strict's to the bit. The fused
        # op keeps each op's rounding in every mode: it matches foreach as Strict runs it.
        torch.testing.assert_close(fused, foreach, rtol=2e-6, atol=2e-7)
        with torch_tpu.eager_mode("strict"):
            foreach = train("tpu", name, foreach=True)
    assert max_ulps(fused, foreach) <= 1
    assert_close_to_cpu(fused, train("cpu", name, fused=True))


@pytest.mark.parametrize("name", ["adamw", "sgd-nesterov"])
def test_capturable_and_tensor_lr(name):
    """fused ignores `capturable` (its state is on the device either way), and a tensor lr
    (tensor_lr overloads) gives what the same float gives; lr = 2**-7 is the same number as
    a float32 tensor and as a Python float."""
    cls, kwargs = OPTIMIZERS[name]
    base = dict(kwargs, lr=2 ** -7)
    OPTIMIZERS["_float"] = (cls, base)
    OPTIMIZERS["_tensor_cpu"] = (cls, dict(base, lr=torch.tensor(2 ** -7)))
    OPTIMIZERS["_tensor_tpu"] = (cls, dict(base, lr=torch.tensor(2 ** -7, device="tpu")))
    try:
        want = train("tpu", "_float", foreach=True)
        for variant in ("_float", "_tensor_cpu", "_tensor_tpu"):
            assert max_ulps(train("tpu", variant, fused=True), want) == 0, variant
        if cls is torch.optim.SGD:
            return
        capturable = train("tpu", "_tensor_tpu", fused=True, capturable=True)
        assert max_ulps(capturable, want) == 0
        # capturable foreach computes the bias corrections in float32 on the device, where
        # 1 - float32(0.999) loses 4 digits to cancellation; fused (like torch's CUDA and
        # CPU kernels, and non-capturable foreach) takes them from Python's doubles
        foreach_capturable = train("tpu", "_tensor_tpu", foreach=True, capturable=True)
        torch.testing.assert_close(capturable, foreach_capturable, rtol=1e-5, atol=1e-6)
    finally:
        for variant in ("_float", "_tensor_cpu", "_tensor_tpu"):
            del OPTIMIZERS[variant]


def test_bf16_parameters_compute_in_float32():
    """As torch's fused kernels: float32 from load to store, one rounding to bf16 (CPU's
    fused AdamW gives the same bits). CPU's fused SGD is no reference for bf16: in torch
    2.13 its vectorized bf16 loop never writes the parameters."""
    got = train("tpu", "adamw", dtype=torch.bfloat16, fused=True)
    want = train("cpu", "adamw", dtype=torch.bfloat16, fused=True)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    assert max_ulps(got, want) <= 1


# ---------------------------------------------------------------- GradScaler's inputs
def _scaled_steps(device, name, scale, found_inf, **impl):
    """Two steps the way GradScaler drives a fused optimizer: the loss scaled, then the
    optimizer's `grad_scale` and `found_inf` set, so the kernel unscales and skips. For
    foreach, what GradScaler does instead: unscale the grads, or skip the step."""
    cls, kwargs = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = Net().to(device)
    opt = cls(model.parameters(), **kwargs, **impl)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)).to(device)
    for _ in range(2):  # the second step has state to keep or update
        opt.zero_grad()
        (model(x).square().mean() * scale).backward()
        if "fused" in impl:
            opt.grad_scale = torch.tensor(scale, device=device)
            opt.found_inf = torch.tensor(float(found_inf), device=device)
        elif found_inf:
            continue
        else:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(scale)
        opt.step()
    params = [p.detach().cpu() for p in model.parameters()]
    grads = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
    return params, _values(model, opt)[len(params):], grads


@pytest.mark.parametrize("name", ["adamw-amsgrad-maximize", "sgd-nesterov"])
def test_grad_scale_unscales_and_found_inf_skips(name):
    scale = 2.0 ** 10  # GradScaler's scales are powers of two: dividing is exact
    fused = _scaled_steps("tpu", name, scale, 0, fused=True)
    foreach = _scaled_steps("tpu", name, scale, 0, foreach=True)
    # parameters, state, and the grads: the kernel writes the unscaled grads back
    for got, want in zip(fused, foreach):
        assert max_ulps(got, want) == 0
    for got, want in zip(fused, _scaled_steps("cpu", name, scale, 0, fused=True)):
        assert_close_to_cpu(got, want)

    params, state, grads = _scaled_steps("tpu", name, scale, 1, fused=True)
    initial, _, _ = _scaled_steps("tpu", name, scale, 1, foreach=True)  # never stepped
    assert max_ulps(params, initial) == 0
    assert max_ulps(grads, [g * scale for g in foreach[2]]) == 0  # left scaled
    if "adam" in name:  # moments untouched, and torch's Python took the step counts back
        assert all(not t.any() for t in state), state


# ---------------------------------------------------------------- one program per step
@pytest.mark.parametrize("name", ["adamw-amsgrad-maximize", "sgd-nesterov"])
def test_one_program_per_step_and_no_recompile_for_a_new_lr(name):
    cls, kwargs = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = Net().to("tpu")
    opt = cls(model.parameters(), **kwargs, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 / (1 + step))
    x = torch.randn(8, 6).to("tpu")
    for i in range(3):
        model(x).square().mean().backward()
        metrics.reset()
        opt.step()
        schedule.step()  # a new lr (and for SGD no longer the first step) each time
        c = metrics.as_dict()["counters"]
        if i > 0:
            # Adam: the step counts' _foreach_add_ and the fused op; SGD: the fused op.
            # Three parameter tensors, one program.
            assert c["dispatches.strict"] == (2 if cls is not torch.optim.SGD else 1), c
        if i == 2:
            assert not c.get("op_entries"), c  # a new lr is a new argument, not a new program
        opt.zero_grad()


# ---------------------------------------------------------------- torch.compile
def test_compiled_step_matches_eager_foreach():
    """torch.optim never traces into a fused step (torch.compiler.disable): the compiled
    step runs it eagerly between graphs, with the eager values."""
    torch._dynamo.reset()
    compiled = train("tpu", "adamw", fused=True,
                     step_fn=lambda opt: torch.compile(opt.step, backend="tpu"))
    assert max_ulps(compiled, train("tpu", "adamw", foreach=True)) <= 1


def test_functional_fused_ops_in_a_compiled_graph():
    """Called in a compiled function, the in-place ops reach the graph as the functional
    `_fused_adamw` / `_fused_adam` (AOTAutograd's functionalization): the same lowering,
    the same bits as eager."""
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr):
        torch._foreach_add_(steps, 1)
        for op, wd in ((torch._fused_adamw_, 0.1), (torch._fused_adam_, 0.01)):
            op(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr=lr,
               beta1=0.9, beta2=0.999, weight_decay=wd, eps=1e-8, amsgrad=True,
               maximize=False)

    def state():
        g = torch.Generator().manual_seed(0)
        shapes = [(6, 5), (5,), ()]
        return ([[torch.randn(s, generator=g).to("tpu") for s in shapes] for _ in range(2)]
                + [[torch.zeros(s, device="tpu") for s in shapes] for _ in range(3)]
                + [[torch.zeros((), device="tpu") for _ in shapes]])

    torch._dynamo.reset()
    metrics.reset()
    compiled, eager = state(), state()
    step_c = torch.compile(step, backend="tpu")
    for lr in (1e-2, 1e-2, 1e-2):
        step_c(*compiled, lr)
        step(*eager, lr)
    c = metrics.as_dict()["counters"]
    assert c["compile.graphs"] == 1 and not c.get("compile.eager_graphs"), c
    assert max_ulps(sum(compiled, []), sum(eager, [])) == 0
