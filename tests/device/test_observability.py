"""Seeing what runs: a device trace that names every program and aten op, torch's own
profiler on tpu code, the program caches' statistics, cache-only serving, program dumps,
`python -m torch_tpu report`, and the warning when shapes keep recompiling one site.

Shapes here are ones no other test uses, so that what a test counts is its own work.
"""
import subprocess
import sys
import warnings

import pytest
import torch
from helpers.dist_launch import run_script
from torch import nn

import torch_tpu
from torch_tpu import profiler


def _mlp(width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, 1)).to("tpu")


def _step(model, opt, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


# ---------------------------------------------------------------- the device trace
def test_a_profiled_training_step_names_its_programs_and_aten_ops(eager, tmp_path):
    model = _mlp(13)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 6, device="tpu")
    _step(model, opt, x)  # compiled before the trace: the trace shows runs, not compiles
    with profiler.trace(tmp_path) as t, profiler.step(1):
        _step(model, opt, x)
    assert t.trace_file is not None and t.xplane_file is not None, t.files
    events = profiler.read_trace(t.trace_file)  # a gzipped Chrome trace: plain JSON
    names = {e.get("name") for e in events}
    if eager == "strict":  # each op is its own program, named by the op
        for op in ("aten.addmm.default", "aten.mm.default", "aten.relu.default"):
            assert f"PjitFunction({op})" in names, sorted(n for n in names if "Pjit" in str(n))
    else:  # each flush is a span naming its graph and listing its aten ops
        spans = [e for e in events if str(e.get("name")).startswith("DeferAndFuse fused_")]
        assert spans, sorted(str(n) for n in names)[:80]
        ops = " ".join(e["args"]["ops"] for e in spans)
        for op in ("aten.addmm.default", "aten.mm.default", "aten.threshold_backward.default"):
            assert op in ops, ops
        for e in spans:  # the program launched inside the span has the graph's name
            assert f"PjitFunction({e['name'].split()[1]})" in names


def test_a_profiled_compiled_step_names_its_graphs(tmp_path):
    model = _mlp(14)
    step = torch.compile(model, backend="tpu")
    x = torch.randn(5, 6, device="tpu")
    step(x).sum().backward()
    with profiler.trace(tmp_path) as t:
        step(x).sum().backward()
    names = {str(e.get("name")) for e in profiler.read_trace(t.trace_file)}
    spans = {n for n in names if n.startswith("torch.compile ")}
    assert {s.split()[1].rstrip("0123456789") for s in spans} >= {"forward", "backward"}, spans


def test_torch_profiler_shows_the_dispatch_side(eager):
    from torch.profiler import ProfilerActivity, profile

    model = _mlp(15)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 6, device="tpu")
    _step(model, opt, x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, opt, x)
    keys = {e.key for e in prof.key_averages()}
    assert {"aten::addmm", "aten::mm", "aten::relu", "AddmmBackward0"} <= keys, sorted(keys)
    if eager == "defer":  # a flush is a record_function range in torch's trace too
        assert any(k.startswith("DeferAndFuse fused_") for k in keys), sorted(keys)


# ---------------------------------------------------------------- statistics
def test_compile_cache_stats_counts_requests_hits_and_bytes(eager):
    x = torch.randn(17, 3, device="tpu")
    torch_tpu.sync()
    before = torch.tpu.compile_cache_stats()
    for _ in range(3):
        (x * 3 + 1).cpu()
    s = torch.tpu.compile_cache_stats()
    kind = "op" if eager == "strict" else "graph"
    new, old = s["kinds"][kind], before["kinds"][kind]
    assert new["requests"] - old["requests"] >= 3 and new["misses"] > old["misses"], (new, old)
    assert new["memory_hits"] - old["memory_hits"] >= 2, (new, old)
    assert new["held"] > 0 and new["bytes"] > 0 and s["bytes"] >= new["bytes"]
    mine = [p for p in s["programs"] if p["kind"] == kind and __file__ in p["where"]]
    assert mine and all(p["compile_seconds"] > 0 and p["bytes"] > 0 for p in mine), mine
    assert {"dir", "entries", "bytes"} <= set(s["disk"] or {"dir": 0, "entries": 0, "bytes": 0})


RUN = r'''
import json, torch, torch_tpu
torch.manual_seed(0)
net = torch.nn.Linear(4, 3).to("tpu")
x = torch.randn(2, 4, device="tpu")
with torch_tpu.eager_mode("defer_and_fuse"):
    for _ in range(2):
        net(x).sum().backward()
        torch_tpu.sync()
for _ in range(2):
    (net(x) * 2).sum().item()
s = torch.tpu.compile_cache_stats()
print("RESULT " + json.dumps({"rank": 0, "kinds": s["kinds"], "disk": s["disk"]}))
'''


@pytest.mark.slow  # two fresh processes and the report command
def test_disk_hits_of_a_second_process_and_the_report_command(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    env = {"TORCH_TPU_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        code, out, results = run_script(script, env=env, timeout=600)
        assert code == 0 and results, out[-4000:]
        runs.append(results[0]["kinds"])
    first, second = runs
    for kind in ("op", "graph"):
        assert first[kind]["xla_compiles"] > 0 and first[kind]["disk_hits"] == 0, first
        # the same programs again: each loaded from the disk cache, none compiled by XLA
        assert second[kind]["disk_hits"] == first[kind]["xla_compiles"], (first, second)
        assert second[kind]["xla_compiles"] == 0 and second[kind]["memory_hits"] > 0, second
    out = subprocess.run([sys.executable, "-m", "torch_tpu", "report", "--cache-dir",
                          str(tmp_path / "cache"), "--runs", "2"], capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "disk cache" in text and "executables" in text and text.count("run of ") == 2, text
    for part in ("DeferAndFuse graphs", "op executables", "disk_hits", "aten.addmm.default",
                 "slowest compiles", "disk hit"):
        assert part in text, (part, text)


# ---------------------------------------------------------------- cache-only serving
def test_cache_only_after_warm_up_passes_and_a_new_shape_raises(eager):
    w = torch.randn(7, 19, device="tpu")
    torch_tpu.sync()  # the weights exist before serving (DeferAndFuse: not in its graph)

    def serve(n):
        return torch.tanh(torch.ones(n, 7, device="tpu") @ w).sum().item()

    n = 3 if eager == "strict" else 5  # (the modes share op programs)
    warm = serve(n)
    old = torch_tpu.set_cache_only(True)
    try:
        assert serve(n) == warm  # everything it needs is compiled
        with pytest.raises(torch_tpu.CacheMissError) as e:
            serve(n + 1)  # DeferAndFuse too raises as the op is recorded, at its line
    finally:
        torch_tpu.set_cache_only(old)
    msg = str(e.value)
    assert "cache-only" in msg and "aten.mm.default" in msg and __file__ in msg, msg
    assert f"shapes changed: argument `self` dim 0 {n} -> {n + 1}" in msg, msg
    expected = torch.tanh(torch.ones(n + 1, 7) @ w.cpu()).sum().item()
    assert serve(n + 1) == pytest.approx(expected, rel=1e-5)  # and compiles once allowed


def test_cache_only_refuses_a_new_compiled_program():
    f = torch.compile(lambda a: (a * 2).sin(), backend="tpu", dynamic=False)
    f(torch.ones(23, device="tpu"))
    old = torch_tpu.set_cache_only(True)
    try:
        f(torch.ones(23, device="tpu"))
        with pytest.raises(torch_tpu.CacheMissError, match="compiled graph"):
            f(torch.ones(24, device="tpu"))
    finally:
        torch_tpu.set_cache_only(old)


# ---------------------------------------------------------------- dumps
def test_dump_dir_holds_each_program_with_its_key_and_reason(eager, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    x = torch.randn(29, device="tpu")
    (x.exp() + 2).cpu()
    (torch.randn(31, device="tpu").exp() + 2).cpu()
    dumps = sorted(tmp_path.glob("*.mlir"))
    texts = [f.read_text() for f in dumps]
    assert texts and all(t.startswith("// kind: ") and "\n// key: " in t and "\n// reason: "
                         in t and "stablehlo." in t and "func.func public @main" in t
                         for t in texts), texts[:1]
    if eager == "strict":
        exp = [t for t in texts if "// name: aten.exp.default" in t]
        assert len(exp) == 2 and "shapes changed: argument `self` dim 0 29 -> 31" in exp[1], exp
    else:
        assert any("// kind: graph" in t and "exponential" in t for t in texts)


# ---------------------------------------------------------------- recompile storms
def test_a_site_that_keeps_recompiling_for_new_shapes_warns_once(eager, monkeypatch):
    from torch_tpu import _recompiles

    monkeypatch.setattr(_recompiles, "STORMS", [])  # (only the first 3 sites warn)
    base = torch.arange(4096, dtype=torch.float32, device="tpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(11):  # powers of two: new sizes even where sizes are bucketed
            (base[:1 << k] * 5).cpu()
    storms = [w for w in caught if issubclass(w.category, torch_tpu.RecompileWarning)]
    assert len(storms) == 1, [str(w.message) for w in storms]
    msg = str(storms[0].message)
    assert storms[0].filename == __file__, storms[0].filename  # at the user's line
    assert "dim 0" in msg and "pad that dimension" in msg and "recompiles" in msg, msg
    assert ("aten.mul.Tensor" if eager == "strict" else "DeferAndFuse graph") in msg, msg
    (listed,) = torch.tpu.compile_cache_stats(False)["storms"]
    assert listed["recompiles"] >= 8 and "dim 0" in listed["varying"], listed


def test_an_optimizer_step_that_raised_does_not_silence_later_warnings(monkeypatch):
    """Compiles inside an optimizer step are layers, not a site recompiling, so they never
    warn; a step that raises (a bad state, a refused capture) is over all the same."""
    from torch_tpu import _recompiles

    monkeypatch.setattr(_recompiles, "STORMS", [])

    class Broken(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure=None):
            super().step()
            raise ValueError("bad state")

    p = nn.Parameter(torch.ones(3, device="tpu"))
    p.grad = torch.ones(3, device="tpu")
    with pytest.raises(ValueError, match="bad state"):
        Broken([p], lr=0.1).step()
    base = torch.arange(4096, dtype=torch.int32, device="tpu")  # (sizes no other test compiles)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(11):
            (base[:1 << k] * 3).cpu()
    storms = [w for w in caught if issubclass(w.category, torch_tpu.RecompileWarning)]
    assert len(storms) == 1, [str(w.message) for w in caught]



def test_layers_of_many_shapes_are_not_a_storm(monkeypatch):
    """Layers of ten different widths reached from one line (a loop over blocks, the
    backward() line every backward op names, `optimizer.step()` updating one parameter at a
    time) are ten sites, each compiling once: no warning (the false alarms a GRPO example,
    a timm optimizer step and a UNet's levels showed)."""
    from torch_tpu import _recompiles

    monkeypatch.setattr(_recompiles, "STORMS", [])
    widths = [8 + 3 * k for k in range(11)]
    layers = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])]).to("tpu")
    opt = torch.optim.Adam(layers.parameters(), foreach=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            x = torch.randn(4, widths[0], device="tpu")
            for layer in layers:
                x = layer(x)
            x.sum().backward()
            opt.step()
            opt.zero_grad()
        torch.tpu.synchronize()
    storms = [str(w.message) for w in caught if issubclass(w.category, torch_tpu.RecompileWarning)]
    assert not storms, storms
    assert layers[0].weight.grad is None and layers[0].weight.isfinite().all()


def test_a_growing_length_warns_with_its_own_dimension_and_remedy(monkeypatch):
    """nanoGPT's generate: each step runs the model on a context one token longer. Two
    layers of different widths at one line (their weights differ) must not hide the
    growing length: the warning names the context's dimension, and the remedy for a
    tensor that grows (a fixed-capacity buffer), not padding a batch. (A batch of 2: a
    batch of 1 is held at a capacity, op/capacity.py, and does not recompile.)"""
    from torch_tpu import _recompiles

    monkeypatch.setattr(_recompiles, "STORMS", [])
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN", "8")
    layers = [torch.nn.Linear(16, 48).to("tpu"), torch.nn.Linear(48, 16).to("tpu")]
    idx = torch.randn(2, 4, 16, device="tpu")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(12):
            x = idx
            for layer in layers:
                x = layer(x)  # one line, two weights
            idx = torch.cat([idx, x[:, -1:]], dim=1)
    storms = [str(w.message) for w in caught if issubclass(w.category, torch_tpu.RecompileWarning)]
    assert storms, "a growing length must warn"
    for msg in storms:  # the context's length, 4, 5, 6, ... (a linear's rows: 2 x that)
        assert ("sizes (4, 5, 6, " in msg or "sizes (8, 10, 12, " in msg) and (
            "grows step by step" in msg), msg
        assert "16, 48" not in msg and "48, 16" not in msg, msg  # not the layers' widths
