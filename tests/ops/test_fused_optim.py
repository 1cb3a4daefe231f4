"""torch.optim's fused Adam, AdamW, SGD and Adagrad (fused=True) on tpu, as a training
script uses them.

Each step is one program for the whole parameter list (`_fused_adam_`, `_fused_adamw_`,
`_fused_sgd_`, `_fused_adagrad_`, lowering/optim.py). Its values are the foreach path's (foreach=True, the
default on tpu) to within 1 ulp in Strict and Debug, and the fused step keeps them when
deferred; DeferAndFuse's own foreach differs from Strict's by XLA's FMA contraction. All
stay close to CPU's fused kernels. Also covered: capturable, a tensor learning rate, a
schedule that changes lr every step (no recompile), GradScaler's grad_scale/found_inf,
bf16 parameters, and torch.compile(backend="tpu") of the step and of the functional ops
in a graph.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import compile as tpu_compile
from torch_tpu import metrics
from torch_tpu.compile import lower

aten = torch.ops.aten

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
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1)),
    "adagrad-decay-maximize": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01,
                                                         weight_decay=0.1, maximize=True)),
}
# DeferAndFuse compiles a graph per distinct step: one Adam and one SGD keep the file fast
DEFER_OPTIMIZERS = ["adamw-amsgrad-maximize", "sgd-nesterov"]
CASES = ([(m, o) for m in ("strict", "debug") for o in OPTIMIZERS]
         + [("defer_and_fuse", o) for o in DEFER_OPTIMIZERS])


def train(device, optimizer, steps=3, step_fn=None, dtype=torch.float32, **impl):
    """A few steps of a small regression with `optimizer` (an OPTIMIZERS name, or a
    (class, kwargs) pair); the parameters and the optimizer state after."""
    cls, kwargs = OPTIMIZERS[optimizer] if isinstance(optimizer, str) else optimizer
    torch.manual_seed(0)
    model = Net().to(device, dtype)
    opt = cls(model.parameters(), **kwargs, **impl)
    step = step_fn(opt) if step_fn else opt.step
    for x, y in _batches(device, steps, dtype):
        F.mse_loss(model(x).float(), y.float()).backward()
        step()
        opt.zero_grad()
    return _values(model, opt)


def _batches(device, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g).to(device, dtype),
             torch.randn(8, 3, generator=g).to(device, dtype)) for _ in range(n)]


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
        # DeferAndFuse runs the backward and the foreach ops as one program, where XLA
        # contracts a product and the add after it into one FMA: one rounding fewer than
        # the ops give on their own, so foreach here is not Strict's to the bit (about
        # 100 ulps of values near zero, 5e-8 absolute). See the next test for the bits.
        torch.testing.assert_close(fused, foreach, rtol=2e-6, atol=2e-7)
    else:
        assert max_ulps(fused, foreach) <= 1
    assert_close_to_cpu(fused, train("cpu", name, fused=True))


def _step_in(mode):
    def wrap(opt):
        def step():
            with torch_tpu.eager_mode(mode):
                opt.step()
        return step
    return wrap


@pytest.mark.parametrize("name", DEFER_OPTIMIZERS)
def test_fused_step_keeps_each_ops_rounding_when_deferred(name):
    """The fused op rounds each intermediate as a foreach op stores it, in every mode:
    the step deferred (the rest Strict, so both get the same grads) gives Strict's
    foreach bits."""
    deferred = train("tpu", name, fused=True, step_fn=_step_in("defer_and_fuse"))
    assert max_ulps(deferred, train("tpu", name, foreach=True)) <= 1


@pytest.mark.parametrize("name", ["adamw", "sgd-nesterov"])
def test_capturable_and_tensor_lr(name):
    """A tensor lr (the tensor_lr overloads), on the host or the device, gives what the
    same float gives (2**-7: the same number as a float32 tensor and as a Python float),
    and fused ignores `capturable`, as torch's kernels do: its state is on the device
    either way."""
    cls, kwargs = OPTIMIZERS[name]
    lr = 2 ** -7
    want = train("tpu", (cls, dict(kwargs, lr=lr)), foreach=True)
    for lr_value in (lr, torch.tensor(lr), torch.tensor(lr, device="tpu")):
        got = train("tpu", (cls, dict(kwargs, lr=lr_value)), fused=True)
        assert max_ulps(got, want) == 0, lr_value
    if cls is torch.optim.SGD:
        return
    spec = (cls, dict(kwargs, lr=torch.tensor(lr, device="tpu")))
    capturable = train("tpu", spec, fused=True, capturable=True)
    assert max_ulps(capturable, want) == 0
    # capturable foreach computes the bias corrections in float32 on the device, where
    # 1 - float32(0.999) loses 4 digits to cancellation; fused (like torch's CUDA and CPU
    # kernels, and like non-capturable foreach) computes them from the doubles
    torch.testing.assert_close(capturable, train("tpu", spec, foreach=True, capturable=True),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["adamw-amsgrad-maximize", "adam-l2"])
def test_bf16_parameters_compute_in_float32(name):
    """As torch's fused kernels: float32 from load to store, one rounding to bf16 for each
    stored tensor; CPU's fused Adam gives the same bits. (CPU's fused SGD is no reference
    for bf16: in torch 2.13 its vectorized bf16 loop never writes the parameters.)"""
    cls, kwargs = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 6), (16,), ()]
    init = [torch.randn(s, generator=g).bfloat16() for s in shapes]
    grads = [[torch.randn(s, generator=g).bfloat16() for s in shapes] for _ in range(3)]

    def run(device):
        params = [torch.nn.Parameter(p.to(device)) for p in init]
        opt = cls(params, **kwargs, fused=True)
        for step_grads in grads:
            for p, grad in zip(params, step_grads):
                p.grad = grad.to(device)
            opt.step()
        return [p.detach().cpu() for p in params] + [
            t.cpu().bfloat16() for p in params for _, t in sorted(opt.state[p].items())]

    assert max_ulps(run("tpu"), run("cpu")) <= 1


# ---------------------------------------------------------------- GradScaler's inputs
def _scaled_steps(device, name, scale, found_inf, **impl):
    """Two steps the way GradScaler drives a fused optimizer: the loss scaled, then the
    optimizer's `grad_scale` and `found_inf` set, so the kernel unscales and skips. For
    foreach, what GradScaler does instead: unscale the grads, or skip the step."""
    cls, kwargs = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = Net().to(device)
    opt = cls(model.parameters(), **kwargs, **impl)
    for x, y in _batches(device, 2):  # the second step has state to keep or update
        opt.zero_grad()
        (F.mse_loss(model(x), y) * scale).backward()
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


@pytest.mark.parametrize("name", ["adamw-amsgrad-maximize", "sgd-nesterov",
                                  "adagrad-decay-maximize"])
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
    initial, _, scaled = _scaled_steps("tpu", name, scale, 1, foreach=True)  # no step
    assert max_ulps(params, initial) == 0
    assert max_ulps(grads, scaled) == 0  # left scaled
    if "adam" in name or "adagrad" in name:  # state untouched, the step counts taken back
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
        with torch_tpu.eager_mode("strict"):
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
@pytest.mark.parametrize("name", ["adamw", "sgd-nesterov"])
def test_compiled_step_matches_eager_foreach(name):
    """torch.optim never traces into a fused step (torch.compiler.disable): the compiled
    step runs it eagerly between graphs, with the eager values."""
    torch._dynamo.reset()
    compiled = train("tpu", name, fused=True,
                     step_fn=lambda opt: torch.compile(opt.step, backend="tpu"))
    assert max_ulps(compiled, train("tpu", name, foreach=True)) <= 1


def test_functional_fused_ops_in_a_compiled_graph(monkeypatch):
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

    lowered = []
    real = lower.op_info
    monkeypatch.setattr(lower, "op_info", lambda op: lowered.append(op) or real(op))
    torch._dynamo.reset()
    metrics.reset()
    compiled, eager = state(), state()
    step_c = torch.compile(step, backend="tpu")
    for _ in range(3):
        step_c(*compiled, 1e-2)
        step(*eager, 1e-2)
    c = metrics.as_dict()["counters"]
    assert c["compile.graphs"] == 1 and not c.get("compile.eager_graphs"), c
    assert aten._fused_adamw.default in lowered and aten._fused_adam.default in lowered
    assert max_ulps(sum(compiled, []), sum(eager, [])) == 0
