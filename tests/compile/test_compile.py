"""torch.compile(backend="tpu"): parity with CPU for Llama, Qwen2 and a CNN (training with
AdamW, greedy generation), AOTAutograd's contract (input mutation, aliased outputs, views,
RNG reproducibility, graph breaks), compile counts, dynamic shapes, a compiled optimizer
step, and the persistent compilation cache: across processes, and with corrupt entries."""
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import transformers

import torch_tpu
from torch_tpu import compile as tpu_compile
from torch_tpu import metrics

tpu_compile.register()  # idempotent; torch_tpu registers "tpu" on import once wired in

VOCAB, SEQ, BATCH = 128, 16, 2


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    metrics.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def one_cpu_thread():
    """CPU references on one thread: torch's two-thread team stalls on a loaded 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _counters():
    return metrics.as_dict()["counters"]


# ---------------------------------------------------------------- models
def _hf_model(kind):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def _train(model, device, steps, compiled):
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for ids in _batches(steps):
        ids = ids.to(device)
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_compiled_training_matches_cpu(kind, one_cpu_thread):
    base = _hf_model(kind)
    ref = _train(copy.deepcopy(base), "cpu", 20, compiled=False)
    got = _train(copy.deepcopy(base), "tpu", 20, compiled=True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=1e-5)
    c = _counters()
    # one forward and one backward graph, each compiled once, for all 20 steps
    assert c["compile.graphs"] == 2 and c["compile.executables"] == 2, c
    assert c["compile.calls"] == 40
    assert not c.get("compile.eager_graphs")


@pytest.mark.slow
def test_greedy_generate_static_cache_matches_cpu(one_cpu_thread):
    """generate(cache_implementation="static") compiles the decode step with
    torch.compile(backend=device.type), i.e. "tpu"."""
    model = _hf_model("llama").eval()
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=5, do_sample=False, cache_implementation="static",
              attention_mask=torch.ones_like(ids), pad_token_id=0)
    ref = model.generate(ids, **kw)
    got = copy.deepcopy(model).to("tpu").generate(ids.to("tpu"), **{
        **kw, "attention_mask": kw["attention_mask"].to("tpu")})
    assert got.cpu().tolist() == ref.tolist()
    assert _counters()["compile.graphs"] >= 1


@pytest.mark.slow
def test_cnn_training_matches_cpu(one_cpu_thread):
    """Conv, BatchNorm (running stats: buffers mutated by a training graph), pooling."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3), torch.nn.Flatten(),
        torch.nn.Linear(8 * 2 * 2, 10))
    cpu, dev = copy.deepcopy(net), copy.deepcopy(net).to("tpu")
    fwd = torch.compile(dev, backend="tpu")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)
        lc = F.cross_entropy(cpu(x), y)
        lc.backward(), opt_c.step(), opt_c.zero_grad()
        ld = F.cross_entropy(fwd(x.to("tpu")), y.to("tpu"))
        ld.backward(), opt_d.step(), opt_d.zero_grad()
        torch.testing.assert_close(ld.cpu(), lc, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dev[1].running_mean.cpu(), cpu[1].running_mean, rtol=1e-4, atol=1e-6)
    assert dev[1].num_batches_tracked.item() == 4


# ---------------------------------------------------------------- AOTAutograd's contract
def _compiled(fn, **kw):
    return torch.compile(fn, backend="tpu", **kw)


def test_input_mutation_inference_and_training():
    def f(x, y):
        x.add_(y)           # a graph input written in place
        x[0].mul_(3)        # through a view of it
        return x * 2

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    xt, yt = x.to("tpu"), y.to("tpu")
    with torch.no_grad():
        out = _compiled(f)(xt, yt)
    ref = f(x, y)
    torch.testing.assert_close(xt.cpu(), x)
    torch.testing.assert_close(out.cpu(), ref)

    w = torch.randn(4, requires_grad=True)
    buf = torch.zeros(4)
    wt, buft = w.detach().to("tpu").requires_grad_(), buf.to("tpu")

    def g(w, buf):
        buf.add_(w.detach())  # a buffer update in a training graph (like BatchNorm stats)
        return (w * w).sum()

    _compiled(g)(wt, buft).backward()
    g(w, buf).backward()
    torch.testing.assert_close(buft.cpu(), buf)
    torch.testing.assert_close(wt.grad.cpu(), w.grad)


def test_input_storage_without_a_buffer_yet():
    """torch.empty's storage gets its buffer at first use: a compiled graph's argument scan
    (csrc program_scan) leaves that call to Python, which makes the buffer and scans again."""
    f = torch.compile(lambda x, y: x * 0 + y, backend="tpu")
    y = torch.arange(4.0, device="tpu")
    assert torch.equal(f(torch.zeros(4, device="tpu"), y).cpu(), torch.arange(4.0))
    assert torch.equal(f(torch.empty(4, device="tpu"), y).cpu(), torch.arange(4.0))


def test_stack_in_a_training_graph_is_lowered():
    """torch.stack arrives whole in an aten graph (eager tpu runs torch's composite
    kernel): without its lowering SAM3's tracker's backward graph ran op by op."""
    def f(xs):
        return torch.stack([x.sin() for x in xs], dim=1).sum(0).square().sum()

    xs = [torch.randn(3, 4, dtype=dt, requires_grad=True)
          for dt in (torch.float32, torch.float32, torch.float64)]
    ts = [x.detach().to("tpu").requires_grad_() for x in xs]
    before = _counters().get("compile.eager_graphs", 0)
    f(xs).backward()
    got = _compiled(f)(ts)
    got.backward()
    torch.testing.assert_close(got.cpu(), f([x.detach() for x in xs]))
    for x, t in zip(xs, ts):
        torch.testing.assert_close(t.grad.cpu(), x.grad)
    assert _counters().get("compile.eager_graphs", 0) == before


def test_mutating_inputs_that_share_storage():
    """Two overlapping views of one tensor, both written: AOTAutograd merges them into a
    synthetic base (as_strided / as_strided_scatter in the graph)."""
    def f(a, b):
        a.mul_(2)
        b.add_(1)
        return a + b

    ref_base, base = torch.arange(6.0), torch.arange(6.0).to("tpu")
    with torch.no_grad():
        ref = f(ref_base[:4], ref_base[2:])
        got = _compiled(f)(base[:4], base[2:])
    torch.testing.assert_close(got.cpu(), ref)
    torch.testing.assert_close(base.cpu(), ref_base)
    assert not _counters().get("compile.eager_graphs")


def test_outputs_alias_inputs_and_views():
    def f(x):
        return x.t(), x[1], x.view(-1) * 1

    x = torch.randn(3, 4)
    xt = x.to("tpu")
    a, b, c = _compiled(f)(xt)
    torch.testing.assert_close(a.cpu(), x.t())
    torch.testing.assert_close(b.cpu(), x[1])
    torch.testing.assert_close(c.cpu(), x.view(-1))
    a.add_(1)  # a view of the input: writing it writes the input, as in eager
    torch.testing.assert_close(xt.cpu(), x + 1)
    assert not c._is_view()


def test_a_graph_that_passes_a_cpu_mask_on_between_graph_breaks():
    """LightGlue's matching: a CPU mask made in the model, a branch on it (a graph break),
    then a helper that indexes the tpu tensor with it and returns the mask too. The
    graph between the breaks only hands its inputs on, the CPU mask among them."""
    def pick(x, keep):
        return x[keep] * 2, keep

    def f(x):
        stops = torch.ones(2, dtype=torch.bool)
        if torch.any(stops):
            return pick(x, stops.repeat_interleave(2))
        return x, stops

    x = torch.arange(12.0).reshape(4, 3)
    for _ in range(2):  # the second call takes the built program
        with torch.no_grad():
            out, keep = _compiled(f)(x.to("tpu"))
        want, want_keep = f(x)
        torch.testing.assert_close(out.cpu(), want)
        assert keep.device.type == "cpu" and torch.equal(keep, want_keep)


def test_training_graph_with_aliased_outputs():
    def f(w, x):
        y = x @ w
        return y, y.t()

    w = torch.randn(4, 4, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    y1, y2 = _compiled(f)(wt, torch.ones(2, 4, device="tpu"))
    (y1.sum() + (y2 * 2).sum()).backward()
    r1, r2 = f(w, torch.ones(2, 4))
    (r1.sum() + (r2 * 2).sum()).backward()
    torch.testing.assert_close(wt.grad.cpu(), w.grad)


def test_fused_attention_in_forward_and_backward_graphs(monkeypatch):
    """F.scaled_dot_product_attention compiles to the fused attention ops (one forward,
    one backward: the lowerings eager uses), with eager's values and gradients."""
    from torch_tpu.compile import lower

    aten = torch.ops.aten

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) * 2

    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(2, h, 6, 8, generator=g, requires_grad=True) for h in (4, 2, 2)]
    tpu = [x.detach().to("tpu").requires_grad_() for x in cpu]
    lowered = []
    real = lower.op_info

    def spy(op):
        lowered.append(op)
        return real(op)

    monkeypatch.setattr(lower, "op_info", spy)
    out = torch.compile(f, backend="tpu")(*tpu)
    out.sum().backward()
    assert aten._scaled_dot_product_fused_attention_overrideable.default in lowered
    assert aten._scaled_dot_product_fused_attention_overrideable_backward.default in lowered
    assert aten.bmm.default not in lowered  # not the math path
    ref = f(*cpu)
    ref.sum().backward()
    torch.testing.assert_close(out.cpu(), ref)
    for a, b in zip(tpu, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


def test_rng_reproducible_with_manual_seed():
    def f(x):
        return F.dropout(x, 0.5, training=True) + torch.rand_like(x)

    cf = _compiled(f)
    x = torch.ones(256, device="tpu")
    torch.manual_seed(0)
    a = cf(x).cpu()
    torch.manual_seed(0)
    b = cf(x).cpu()
    c = cf(x).cpu()
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)  # the generator advanced
    # the graph draws exactly what eager draws from the same seed
    torch.manual_seed(0)
    torch.testing.assert_close(a, f(x).cpu())


def test_compiled_graphs_inside_defer_and_fuse():
    """Deferred eager work feeding a compiled graph runs first; the graph's outputs then
    flow back into deferred eager ops."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref, dev = copy.deepcopy(net), copy.deepcopy(net).to("tpu")
    fwd = _compiled(dev)
    g = torch.Generator().manual_seed(0)
    with torch_tpu.eager_mode("defer_and_fuse"):
        for _ in range(2):
            x = torch.randn(4, 8, generator=g)
            got = fwd(x.to("tpu") * 2 + 1).square().mean()
            got.backward()
            want = ref(x * 2 + 1).square().mean()
            want.backward()
            torch.testing.assert_close(got.cpu(), want.detach())
    torch.testing.assert_close(dev[0].weight.grad.cpu(), ref[0].weight.grad)


def test_graph_break_falls_back_to_eager():
    def f(x):
        y = x.sin() * 2
        if y.sum() > 0:  # data-dependent branch: dynamo breaks the graph here
            y = y + 1
        return y.cos()

    x = torch.randn(8)
    torch.testing.assert_close(_compiled(f)(x.to("tpu")).cpu(), f(x))
    assert _counters()["compile.graphs"] == 2  # before and after the break


def test_recompiles_only_on_guard_failure():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
    fwd = _compiled(net, dynamic=False)
    for _ in range(5):
        fwd(torch.randn(4, 8, device="tpu")).sum().backward()
    c = _counters()
    assert (c["compile.dynamo_graphs"], c["compile.graphs"], c["compile.executables"]) == (1, 2, 2)
    fwd(torch.randn(6, 8, device="tpu")).sum().backward()  # new batch size: a guard fails
    c = _counters()
    assert (c["compile.dynamo_graphs"], c["compile.graphs"], c["compile.executables"]) == (2, 4, 4)


def test_dynamic_shapes_specialize_per_size():
    def f(x):
        return F.softmax(x.view(-1, 4) @ torch.ones(4, 3, device=x.device), -1).sum(1)

    cf = _compiled(f, dynamic=True)
    for n in (8, 12, 8):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x))
    c = _counters()
    assert c["compile.dynamo_graphs"] == 1 and c["compile.executables"] == 2


def test_mark_dynamic_traces_once_and_padded_batches_compile_per_bucket():
    """`torch._dynamo.mark_dynamic` is honoured: one dynamo graph for every size, one XLA
    executable per concrete size; batches padded to their bucket (torch_tpu.pad_to_bucket)
    bring that down to one per bucket (docs/DYNAMIC_SHAPES.md)."""
    import torch_tpu

    def f(x):
        return (x.float() * 2).sum(-1)

    cf = _compiled(f)
    for n in (20, 30, 17, 40, 33):
        x = torch.randint(1, 9, (2, n))
        xt = torch_tpu.pad_to_bucket(x).to("tpu")  # 20, 30, 17 -> 32; 40, 33 -> 64
        torch._dynamo.mark_dynamic(xt, 1)
        torch.testing.assert_close(cf(xt).cpu(), f(x))
    c = _counters()
    assert c["compile.dynamo_graphs"] == 1 and c["compile.executables"] == 2, c


def test_compiled_optimizer_step():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ref, dev = copy.deepcopy(net), copy.deepcopy(net).to("tpu")
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    step = torch.compile(opt_d.step, backend="tpu")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(5, 6, generator=g)
        ref(x).square().sum().backward()
        opt_r.step(), opt_r.zero_grad()
        dev(x.to("tpu")).square().sum().backward()
        step()
        opt_d.zero_grad()
    for p, q in zip(dev.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert not _counters().get("compile.eager_graphs")


def test_cpu_scalars_in_a_graph_run_on_the_host():
    """CPU 0-dim tensors beside tpu tensors (a non-capturable optimizer's step counters):
    their math and their in-place updates run on the host, the device reads the result."""
    def f(x, step):
        step.add_(1)
        return x * (1 - 0.9 ** step)

    x = torch.randn(5)
    step_c, step_t = torch.tensor(2.0), torch.tensor(2.0)
    cf = _compiled(f)
    with torch.no_grad():
        for _ in range(3):
            got = cf(x.to("tpu"), step_t)
            ref = f(x, step_c)
            torch.testing.assert_close(got.cpu(), ref)
    assert step_t.device.type == "cpu" and step_t.item() == step_c.item() == 5.0
    assert _counters()["compile.executables"] == 1


def test_graph_with_unlowered_op_runs_eagerly():
    from torch_tpu import _dispatch

    # a user's custom op: a CPU kernel and a fake one for tracing, no tpu lowering
    lib = torch.library.Library("torch_tpu_compile_test", "DEF")
    lib.define("triple(Tensor x) -> Tensor")
    lib.impl("triple", lambda x: x * 3, "CPU")
    lib.impl("triple", lambda x: torch.empty_like(x), "Meta")
    triple = torch.ops.torch_tpu_compile_test.triple.default

    def f(x):
        return triple(x * 2).abs() + 1

    x = torch.randn(8)
    saved = _dispatch._cpu_fallback[0]
    torch_tpu.set_cpu_fallback(True)  # the eager run of the graph sends triple to CPU
    try:
        with pytest.warns(UserWarning, match="torch_tpu_compile_test.triple"):
            out = _compiled(f)(x.to("tpu"))
    finally:
        torch_tpu.set_cpu_fallback(saved)
    torch.testing.assert_close(out.cpu(), f(x))
    assert _counters()["compile.eager_graphs"] == 1


def test_lowerings_returning_named_tuples():
    """A lowering's named tuple (jax's SVDResult behind svdvals, torch.return_types) comes
    back from a graph as its fields, cast to the meta dtypes."""
    x = torch.randn(5, 3)

    def f(a):
        s = torch.linalg.svdvals(a)
        values, indices = torch.sort(a, dim=0)
        return s, values, indices, torch.linalg.eigvalsh(a.T @ a)

    got = _compiled(f)(x.to("tpu"))
    for g, want in zip(got, f(x)):
        torch.testing.assert_close(g.cpu(), want, rtol=1e-4, atol=1e-4)


def test_cpu_output_keeps_its_layout_and_host_constants_lower():
    """A graph's CPU output in channels_last is that layout, values in place (it was read
    as if contiguous); a tensor the graph makes from a Python number (kaiser's
    `torch.tensor(beta)`) is a constant lowered while AOTAutograd's fake mode is on."""
    x = torch.randn(2, 3, 4, 5)

    def to_host(a):
        return (a * 2).to("cpu", torch.float64, memory_format=torch.channels_last)

    got = _compiled(to_host)(x.to("tpu"))
    assert got.device.type == "cpu" and got.stride() == to_host(x).stride()
    torch.testing.assert_close(got, to_host(x))

    def window(n):
        return torch.signal.windows.kaiser(n, sym=False, beta=2, device=x.to("tpu").device)

    torch.testing.assert_close(_compiled(window)(8).cpu(), torch.signal.windows.kaiser(8, sym=False,
                                                                                       beta=2))


def test_compiled_istft_backward_matches_cpu():
    """istft's compiled backward hands unfold_backward a gradient that broadcasts to the
    windows (one row for all)."""
    torch.manual_seed(0)
    x, g = torch.randn(10, 10, 6, dtype=torch.complex64), torch.randn(10, 20)

    def f(a):
        return torch.istft(a, n_fft=10, window=torch.ones(10, device=a.device), center=False)

    want = x.clone().requires_grad_(True)
    f(want).backward(g)
    got = x.to("tpu").requires_grad_(True)
    _compiled(f)(got).backward(g.to("tpu"))
    torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5)


def test_compiled_native_batch_norm_out_matches_cpu():
    """native_batch_norm(..., out=) compiled: the outs and the running stats as CPU's."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 4, 5), torch.randn(4), torch.randn(4)

    def f(x, w, b, rm, rv, outs):
        return torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, out=outs)

    def run(dev, fn):
        state = [torch.zeros(4, device=dev), torch.ones(4, device=dev)]
        outs = (torch.empty(3, 4, 5, device=dev), torch.empty(4, device=dev), torch.empty(4, device=dev))
        fn(x.to(dev), w.to(dev), b.to(dev), *state, outs)
        return [t.cpu() for t in (*outs, *state)]

    for got, want in zip(run("tpu", _compiled(f)), run("cpu", f)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_compiled_margin_losses_match_eager(reduction):
    """torch's own tracing gets these wrong on every backend: multilabel_margin_loss's
    decomposition counts the slots after a -1 as class 0, and one sample's unreduced
    loss comes out (1,) where eager gives ()."""
    torch.manual_seed(0)
    F = torch.nn.functional
    cases = [(F.multilabel_margin_loss, torch.randn(5), torch.tensor([1, 3, -1, 0, 0])),
             (F.multilabel_margin_loss, torch.randn(2, 4), torch.tensor([[2, -1, 0, 1], [0, 1, 2, 3]])),
             (F.multi_margin_loss, torch.randn(5), torch.tensor(2)),
             (F.multi_margin_loss, torch.randn(5), torch.tensor([2]))]
    for loss, x, t in cases:
        want_x = x.clone().requires_grad_(True)
        want = loss(want_x, t, reduction=reduction)
        want.sum().backward()
        got_x = x.to("tpu").requires_grad_(True)
        got = _compiled(lambda a, b: loss(a, b, reduction=reduction))(got_x, t.to("tpu"))
        got.sum().backward()
        assert got.shape == want.shape
        torch.testing.assert_close(got.detach().cpu(), want.detach())
        torch.testing.assert_close(got_x.grad.cpu(), want_x.grad)


_REFUSED = {  # what torch's fake kernels let through on tpu, refused in CPU's words
    "bucketize": (lambda d: torch.bucketize(torch.rand(4, device=d), torch.rand(2, 3, device=d)),
                  "boundaries tensor must be 1 dimension"),
    "complex": (lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64,
                                                                              device=d)),
                "Expected object of scalar type Float but got scalar type Double"),
    "masked_scatter": (lambda d: torch.ones(3, device=d).masked_scatter(
        torch.ones(3, dtype=torch.uint8, device=d), torch.ones(3, device=d)),
        "masked_scatter_ only supports boolean masks, but got mask with dtype Byte"),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_compiled_refusals_as_eager(case):
    fn, words = _REFUSED[case]
    with pytest.raises(RuntimeError, match=words):
        fn("cpu")
    with pytest.raises(RuntimeError, match=words):
        _compiled(fn)("tpu")


# ---------------------------------------------------------------- persistent cache
_STEP_SCRIPT = textwrap.dedent("""
    import json
    import torch, torch_tpu
    from torch_tpu import _cache, compile as tpu_compile, metrics
    _cache.setup()          # idempotent; torch_tpu does it on import once wired in
    tpu_compile.register()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("tpu")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    fwd = torch.compile(net, backend="tpu")
    x = torch.randn(3, 8).to("tpu")
    for _ in range(2):
        loss = fwd(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    c = metrics.as_dict()["counters"]
    print(json.dumps({"loss": loss.item(), "compiles": c.get("xla.compiles", 0),
                      "hits": c.get("xla.cache_hits", 0)}))
""")


def _run_step_process(cache_dir):
    import json

    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", _STEP_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_process_compiles_nothing(tmp_path):
    """`xla.compiles` counts executables XLA built in the process; `xla.cache_hits` those
    loaded from TORCH_TPU_CACHE_DIR instead. Eager ops and compiled graphs alike."""
    first = _run_step_process(tmp_path)
    assert first["compiles"] > 0
    second = _run_step_process(tmp_path)
    assert second["compiles"] == 0, second
    assert second["hits"] == first["compiles"] + first["hits"]
    assert second["loss"] == first["loss"]


def test_corrupt_cache_entries_are_ignored(tmp_path):
    """A damaged entry (torn write, bit flip) is detected by its checksum before XLA
    deserializes it: a warning, the entry is dropped, the program compiles again."""
    import jax
    import jax.numpy as jnp

    from torch_tpu import _cache

    previous = _cache.cache_dir()
    _cache.setup(tmp_path)
    try:
        x = jnp.arange(4.0)
        assert float(jax.jit(lambda v: v * 3 + 1)(x).sum()) == 22.0
        entries = list(tmp_path.glob("*.xla"))
        assert entries
        for f in entries:
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0xFF
            f.write_bytes(bytes(data[:-7]))
        compiles = _counters().get("xla.compiles", 0)
        with pytest.warns(UserWarning, match="corrupt compilation cache entry"):
            # a new function object with the same program: a fresh lookup of the same key
            assert float(jax.jit(lambda v: v * 3 + 1)(x).sum()) == 22.0
        assert _counters().get("xla.compiles", 0) > compiles
    finally:
        if previous is None:
            _cache.disable()
        else:
            _cache.setup(previous)
