"""Capture and replay (torch/eager/capture.py): `torch.tpu.graph` / `TPUGraph`, and
`torch.accelerator.Graph` on tpu.

The user's view first: PyTorch's documented CUDA-graph recipe (whole training step with a
capturable AdamW, then a KV-cache decode step), written for CUDA and run with the device
strings changed, equals the same script run eagerly on CPU and on tpu, in both eager
modes, dropout included (replay draws as eager draws). Then what replay must not do
(compile, read back, flush), counted; then what capture cannot hold, each a CaptureError
naming the user's line, after which the process and the tensors are as before."""
import gc
import itertools
import pathlib

import pytest
import torch
from torch import nn

import torch_tpu
from torch_tpu import metrics
from torch_tpu.eager.capture import CaptureError

from helpers.dist_launch import run_single, swap_cuda

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "cuda_graphs.py"
QUIET = {"TORCH_TPU_RECOMPILE_WARN": "0"}


@pytest.fixture(scope="module")
def cpu_run():
    return run_single(SCRIPT, env={**QUIET, "FORCE_CPU": "1"}, timeout=300)[0]


@pytest.fixture(scope="module")
def tpu_script(tmp_path_factory):
    return swap_cuda(SCRIPT, tmp_path_factory.mktemp("graphs") / "graphs_tpu.py")


def _close(got, want, tol):
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]),
                               rtol=tol, atol=tol)
    for a, b in zip(got["params"], want["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_documented_cuda_graph_recipe_matches_cpu(mode, cpu_run, tpu_script):
    """The training step replayed over 6 batches, and 12 greedy tokens decoded by replays,
    equal CPU eager's; the replays compile nothing."""
    env = {**QUIET, **({"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "defer_and_fuse" else {})}
    got, out = run_single(tpu_script, env=env, timeout=300)
    assert got["graphs"], out[-3000:]
    _close(got, cpu_run, 1e-5)
    assert got["tokens"] == cpu_run["tokens"]
    assert got["train_built"] == 0 and got["decode_built"] == 0, got


OPTIMIZERS = pathlib.Path(__file__).parents[1] / "user_code" / "cuda_graph_optimizers.py"


@pytest.fixture(scope="module")
def optimizers_on_cpu():
    return run_single(OPTIMIZERS, env={**QUIET, "FORCE_CPU": "1"}, timeout=300)[0]["cases"]


@pytest.mark.parametrize("mode", ["strict", pytest.param("defer_and_fuse", marks=pytest.mark.slow)])
def test_every_optimizer_torch_captures_replays_as_cpu(mode, optimizers_on_cpu, tmp_path):
    """Each optimizer torch's CUDA-graph tests capture (SGD plain, momentum, foreach, fused;
    Adagrad and its fused step; Adam, AdamW, NAdam, RAdam, Rprop, Adamax, ASGD, Adadelta,
    RMSprop with capturable=True; a tensor lr under a scheduler; GradScaler with a fused
    step): a whole training step captured and replayed gives CPU eager's losses and
    parameters, and the replays build no program. In DeferAndFuse a scheduler's update
    between replays is one small graph of its own (its ops in a new order): one build."""
    env = {**QUIET, **({"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "defer_and_fuse" else {})}
    got, out = run_single(swap_cuda(OPTIMIZERS, tmp_path / "optimizers_tpu.py"), env=env,
                          timeout=300)
    got = got["cases"]
    assert set(got) == set(optimizers_on_cpu), out[-3000:]
    for name, want in optimizers_on_cpu.items():
        # (capturable Adam computes its bias corrections in float32 on the device, where
        # torch's CPU path uses Python floats: 1 - 0.999 loses digits, as on CUDA)
        _close(got[name], want, 1e-5)
        scheduled = mode == "defer_and_fuse" and name.endswith("_scheduled")
        assert got[name]["built"] == (1 if scheduled else 0), (name, got[name]["built"])


def test_replay_draws_random_numbers_as_eager_does(tpu_script):
    """With dropout, each replay draws new masks, the ones eager draws for the same steps
    (the default generator advances by what the region drew)."""
    env = {**QUIET, "DROPOUT": "0.2"}
    graphs, _ = run_single(tpu_script, env={**env, "GRAPHS": "1"}, timeout=300)
    eager, _ = run_single(tpu_script, env={**env, "GRAPHS": "0"}, timeout=300)
    _close(graphs, eager, 1e-6)
    assert len(set(graphs["losses"])) == len(graphs["losses"])


# ---------------------------------------------------------------- what replay costs
def _decoder():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)).to("tpu")
    tok = torch.tensor([3], device="tpu")
    seen = torch.zeros(8, dtype=torch.long, device="tpu")
    pos = torch.zeros(1, dtype=torch.long, device="tpu")

    @torch.no_grad()
    def step():
        nxt = net(tok).argmax(-1)
        seen.index_copy_(0, pos, nxt)
        tok.copy_(nxt)
        pos.add_(1)

    return step, seen


def test_replay_compiles_nothing_and_reads_nothing_back(eager):
    step, seen = _decoder()
    step()  # eager warm-up: the ops' programs
    want = [seen[0].item()]
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        step()
    before = metrics.counters.copy()
    for _ in range(7):
        g.replay()
    grew = metrics.counters - before
    assert grew["graphs.replays"] == 7
    assert not any(k.startswith(("programs.", "flush.", "device_to_host", "host_to_device",
                                 "cache_misses", "fused_graphs_compiled")) for k in grew), grew
    got = seen.tolist()
    # the eager step's token, then 7 more from replays (the greedy chain continued)
    assert got[0] == want[0] and len(set(got)) >= 1
    step2, seen2 = _decoder()
    for _ in range(8):
        step2()
    assert got == seen2.tolist()


def test_captured_programs_live_in_the_one_program_cache(eager):
    """A captured region's program is held by the one program cache: counted in its stats,
    shared by an equal region captured again, and refused, naming the region's line, in
    cache-only mode (as a fused graph or a compiled one would be)."""
    step, seen = _decoder()
    step()
    seen.cpu()
    before = metrics.counters.copy()
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        step()
    g.replay()
    grew = metrics.counters - before
    assert grew["graphs.compiled"] + grew["graphs.cache_hits"] == 1, grew
    names = [p["name"] for p in torch.tpu.compile_cache_stats(disk=False)["programs"]]
    assert any(n.startswith("captured_") for n in names), names
    before = metrics.counters.copy()
    g2 = torch.tpu.TPUGraph()
    with torch.tpu.graph(g2):
        step()
    g2.replay()
    assert (metrics.counters - before)["graphs.cache_hits"] == 1
    other = torch.zeros(next(_SIZES), device="tpu")  # a region no test captured before,
    other.add_(1)                                       # of ops compiled already
    torch.tpu.synchronize()
    previous = torch_tpu.set_cache_only(True)
    try:
        g3 = torch.tpu.TPUGraph()
        with pytest.raises(torch_tpu.CacheMissError, match="region captured at .*test_capture.py"):
            with torch.tpu.graph(g3):
                step()
                other.add_(1)
    finally:
        torch_tpu.set_cache_only(previous)
    want = seen.clone()
    g.replay()  # the graph holds its program: it still replays
    assert not torch.equal(seen, want) or len(set(want.tolist())) == 1


_SIZES = itertools.count(1001)


def test_replay_steps_runs_n_replays_in_one_launch(eager):
    """replay_steps(n): what n replays in a row give (each run reads the last one's writes,
    random ops draw anew each run), from one launch; the loop compiles once, by graph."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to("tpu")
    x, acc, noise = (torch.zeros(2, 8, device="tpu") for _ in range(3))
    x.copy_(torch.randn(2, 8))

    @torch.no_grad()
    def step():
        x.copy_(torch.tanh(lin(x)))
        acc.add_(x)
        noise.add_(torch.rand(2, 8, device="tpu"))

    start = [t.clone() for t in (x, acc, noise)]
    step()  # warm-up
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        step()

    def run(launch):
        for t, s in zip((x, acc, noise), start):
            t.copy_(s)
        torch.manual_seed(5)
        launch()
        return [t.cpu() for t in (x, acc, noise)], torch.tpu.default_generators[0].get_offset()

    def loops():
        g.replay_steps(3)
        g.replay_steps(2)

    one_by_one = run(lambda: [g.replay() for _ in range(5)])
    looped = run(loops)  # (its loop program compiles now, or came from another graph's)
    before = metrics.counters.copy()
    again = run(loops)
    grew = metrics.counters - before
    for a, b, c in zip(one_by_one[0], looped[0], again[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    assert one_by_one[1] == looped[1] == again[1]  # the generator past the same draws
    assert grew["graphs.replays"] == 5 and not grew["graphs.compiled"], grew


@pytest.mark.parametrize("launch", ["replay", "replay_steps"])
def test_a_graph_keeps_no_buffer_of_the_capture_time(eager, launch):
    """After replays, the buffers the region read at capture (the old values of what it
    updates) are gone: the graph holds its program, not them."""
    import jax

    def live():  # every XLA buffer alive in the process, owned by a tensor or not
        return sum(a.nbytes for a in jax.live_arrays())

    w = torch.zeros(1 << 20, device="tpu")  # 4 MiB, updated in place by the region

    def step():
        w.add_(1)

    step()
    torch.tpu.synchronize()
    before = live()
    g = torch.tpu.TPUGraph(keep_graph=launch == "replay_steps")
    with torch.tpu.graph(g):
        step()
    for _ in range(2):
        g.replay() if launch == "replay" else g.replay_steps(3)
    torch.tpu.synchronize()
    gc.collect()
    assert live() - before < (1 << 20)
    assert w[0].item() == (3 if launch == "replay" else 7)


def test_capture_runs_nothing_until_replay(eager):
    w = torch.ones(4, device="tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        w.mul_(2)
        out = w + 1
    assert w.tolist() == [1.0] * 4 and out.tolist() == [0.0] * 4
    g.replay()
    assert w.tolist() == [2.0] * 4 and out.tolist() == [3.0] * 4
    g.replay()
    assert w.tolist() == [4.0] * 4 and out.tolist() == [5.0] * 4


def test_accelerator_graph_is_the_tpu_graph():
    x = torch.zeros(100, device="tpu")
    g = torch.accelerator.Graph()
    with g:  # synchronizes and empties the device and host caches first
        x += 1
    for _ in range(3):
        g.replay()
    assert x.sum().item() == 300.0
    torch.accelerator.empty_host_cache()


# ---------------------------------------------------------------- what capture cannot hold
def _fails(fn, fragment):
    g = torch.tpu.TPUGraph()
    with pytest.raises(CaptureError, match=fragment) as err:
        with torch.tpu.graph(g):
            fn()
    assert not torch.tpu.is_current_stream_capturing()
    return str(err.value)


def test_host_reads_inside_capture_name_the_line(eager):
    w = torch.full((3,), 2.0, device="tpu")
    msg = _fails(lambda: (w.mul_(3), (w * 2).sum().item()), "reads a value on the host")
    assert f"{__file__}:" in msg
    assert w.tolist() == [2.0] * 3  # the region's write was given back
    _fails(lambda: print(w * 2), "prints a tensor")
    _fails(lambda: (w * 2).cpu(), "copies a tensor to the host")
    _fails(lambda: torch.nonzero(w), "depends on the data")
    _fails(lambda: w.copy_(torch.ones(3)), "reads a CPU tensor")
    _fails(lambda: torch.rand(3, device="tpu", generator=torch.Generator("tpu")),
           "generator other than")
    assert (w * 2).tolist() == [4.0] * 3  # the process goes on


def test_optimizer_step_needs_capturable(eager):
    lin = nn.Linear(4, 4).to("tpu")
    opt = torch.optim.AdamW(lin.parameters())
    x = torch.ones(2, 4, device="tpu")
    lin(x).sum().backward()
    opt.step()
    before = lin.weight.detach().cpu()

    def step():
        lin(x).sum().backward()
        opt.step()

    _fails(step, "capturable is False")
    torch.testing.assert_close(lin.weight.detach().cpu(), before)


def test_replay_refuses_a_resized_input():
    x = torch.ones(4, device="tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        y = x * 2
    x.untyped_storage().resize_(8 * 4)
    with pytest.raises(CaptureError, match="resized"):
        g.replay()
    del y


def test_graph_lifecycle_errors():
    g = torch.tpu.TPUGraph()
    with pytest.raises(CaptureError, match="nothing was captured"):
        g.replay()
    x = torch.ones(2, device="tpu")
    with torch.tpu.graph(g):
        x.add_(1)
    with pytest.raises(CaptureError, match="reset"):
        g.capture_begin()
    g.reset()
    with torch.tpu.graph(g):
        x.add_(2)
    g.replay()
    assert x.tolist() == [3.0, 3.0]
    assert torch_tpu.get_eager_mode().value in ("strict", "defer_and_fuse")


def test_a_compiled_module_inside_the_region_replays_with_it():
    """torch.compile(backend="tpu") graphs called warm inside a region become one node of
    it (their constants held by the graph); dropout inside them draws anew per replay."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).to("tpu")
    fn = torch.compile(net, backend="tpu")
    x = torch.ones(4, 8, device="tpu")
    fn(x)  # the first call traces and runs at once: outside the region
    state = torch.tpu.get_rng_state()
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        y = fn(x) * 2
    outs = []
    for _ in range(3):
        g.replay()
        outs.append(y.cpu())
    torch.tpu.set_rng_state(state)
    want = [(fn(x) * 2).cpu() for _ in range(3)]
    for a, b in zip(outs, want):
        torch.testing.assert_close(a, b)
    assert not torch.equal(outs[0], outs[1])


def test_a_compiled_graph_first_called_inside_the_region_compiles_only_with_it():
    """A torch.compile graph called for the first time inside a region: its results'
    shapes come from an abstract trace, so it is recorded like a warm call; its graph is
    compiled inside the region's program only, never as a program of its own, and
    replays equal the compiled call made after the capture."""
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).to("tpu")
    fn = torch.compile(net, backend="tpu")
    x = torch.randn(4, 8).to("tpu")
    compiled = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]["compiled"]
    before = compiled["xla_compiles"]
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        y = fn(x) + 1
    g.replay()
    got = y.cpu()
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    assert kinds["compiled"]["xla_compiles"] == before
    x.copy_(torch.randn(4, 8))
    g.replay()
    torch.testing.assert_close(y.cpu(), (net(x) + 1).cpu())
    assert not torch.equal(got, y.cpu())


def test_hf_llama_decode_step_over_a_static_cache_replays():
    """An HF Llama's decode step over its StaticCache, captured: HF's host-side checks
    (is_tracing) see the capture, as they see CUDA's, and replayed tokens equal eager's."""
    from torch_tpu_tools.workloads import decoder
    from transformers import StaticCache

    base = decoder.build_model(decoder.DecoderSpec(pad=0)).eval()

    def runner():
        model = __import__("copy").deepcopy(base).to("tpu")
        cache = StaticCache(config=model.config, max_cache_len=16)
        tok = torch.tensor([[3]], device="tpu")
        pos = torch.zeros(1, dtype=torch.long, device="tpu")
        out = torch.zeros(16, dtype=torch.long, device="tpu")

        @torch.no_grad()
        def step():
            logits = model(input_ids=tok, cache_position=pos, past_key_values=cache,
                           use_cache=True).logits
            nxt = logits[:, -1].argmax(-1)
            out.index_copy_(0, pos, nxt)
            tok.copy_(nxt.view(1, 1))
            pos.add_(1)
        return step, out

    step, want = runner()
    for _ in range(10):
        step()
    step, got = runner()
    step()
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        step()
    for _ in range(9):
        g.replay()
    assert got.tolist() == want.tolist()


def test_reduce_overhead_mode_runs_each_graph_as_one_program(recwarn):
    """`torch.compile(mode="reduce-overhead")`, with the default backend or backend="tpu":
    no warning that the mode is ignored, and each call of the compiled inference graph is
    one XLA call of one cached program."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to("tpu").eval()
    x = torch.randn(3, 8, device="tpu")
    want = net(x).cpu()
    for fn in (torch.compile(net, mode="reduce-overhead"),
               torch.compile(net, backend="tpu", mode="reduce-overhead")):
        with torch.no_grad():
            fn(x)
            before = metrics.counters.copy()
            outs = [fn(x).cpu() for _ in range(3)]
        grew = metrics.counters - before
        assert grew["compile.calls"] == 3 and not any(k.startswith("programs.") for k in grew)
        for o in outs:
            torch.testing.assert_close(o, want)
    assert not [w for w in recwarn if "mode/options" in str(w.message)]


def test_make_graphed_callables_trains_like_the_module():
    """A module and a function graphed (forward and backward captured), trained with an
    eager SGD over 4 batches, end with the plain copies' parameters and losses."""
    import copy

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("tpu")
    module = copy.deepcopy(plain)

    def head(x):
        return (x * 2).sin()

    x = torch.randn(5, 8, device="tpu", requires_grad=True)
    module, ghead = torch.tpu.make_graphed_callables(
        (module, head), ((x,), (torch.randn(5, 4, device="tpu", requires_grad=True),)))
    runs = {}
    for name, (m, h) in {"plain": (plain, head), "graphed": (module, ghead)}.items():
        before = metrics.counters["graphs.replays"]
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for i in range(4):
            torch.manual_seed(10 + i)
            xi = torch.randn(5, 8, device="tpu", requires_grad=True)
            loss = h(m(xi)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[name] = (losses, [p.detach().cpu() for p in m.parameters()], xi.grad.cpu())
        # each step: forward and backward of both callables, replayed
        assert metrics.counters["graphs.replays"] - before == (16 if name == "graphed" else 0)
    torch.testing.assert_close(runs["graphed"][0], runs["plain"][0])
    for a, b in zip(runs["graphed"][1], runs["plain"][1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(runs["graphed"][2], runs["plain"][2])
