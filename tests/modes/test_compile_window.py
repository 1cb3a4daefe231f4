"""Strict's compile window (eager/window.py): a CUDA-style script, only the device string
changed, run in fresh processes on tpu with the window (the default) and without it
(TORCH_TPU_COMPILE_WINDOW=0), and on CPU. The window must change when programs compile,
never which programs exist or what they compute: the two tpu runs agree bit for bit and
compile the same programs, and both match CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# three fresh processes (~16 s); every other Strict test runs its first ops through the window
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import json, sys, threading
    import torch, torch.nn as nn, torch.nn.functional as F
    dev = sys.argv[1]
    if dev == "tpu":
        import torch_tpu
        counters = torch_tpu.metrics.counters
    else:
        counters = {}
    torch.manual_seed(0)
    out = {"losses": [], "windows": []}

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 32)
            self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(),
                                                      nn.Linear(64, 32)) for _ in range(3))
            self.head = nn.Linear(32, 50)

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = x + b(x)
            return self.head(x)

    model = Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, 50, (4, 4, 9))
    for step in range(4):
        ids = data[step].to(dev)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
        out["windows"].append(counters.get("window.opened", 0))

    # in-place writes through views, a host read in the middle, data-dependent shapes
    x = torch.zeros(6, 5, device=dev)
    y = torch.arange(10.0, device=dev).reshape(2, 5)
    x[2:4] += y
    x.t()[1].mul_(3)
    mid = x.sum().item()
    z = x.cos() * 2
    nz = torch.nonzero(z > 1.5)
    w = z[z > 1.5].sum() + nz.float().sum()
    out["views"] = [mid, x.cpu().tolist(), w.item()]

    # a bad call raises at its line, in the window as outside it; the process goes on
    a = torch.randn(3, 4, device=dev).exp()
    try:
        torch.mm(a, torch.randn(3, 4, device=dev))
        out["error"] = None
    except RuntimeError as e:
        out["error"] = "size" in str(e) or "shape" in str(e) or "mat1" in str(e)
    out["after_error"] = (a.log() * 0 + 1).sum().item()

    # ops from another thread while a window may be open
    r = {}
    def work():
        t = torch.linspace(0, 1, 17, device=dev)
        r["v"] = (t.tanh() ** 2).sum().item()
    th = threading.Thread(target=work)
    th.start(); th.join()
    out["thread"] = r["v"]
    out["counters"] = {k: v for k, v in counters.items()
                       if k.startswith(("window.", "compile.ahead", "executables_compiled",
                                        "programs.op"))}
    print("RESULT " + json.dumps(out))
''')


def _run(tmp_path, dev, **env):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    full.update(TORCH_TPU_CACHE_DIR="", **env)  # (no persistent cache: every program compiles)
    proc = subprocess.run([sys.executable, str(path), dev], env=full, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("window")
    return {"window": _run(tmp, "tpu"), "plain": _run(tmp, "tpu", TORCH_TPU_COMPILE_WINDOW="0"),
            "cpu": _run(tmp, "cpu")}


def test_the_window_computes_what_strict_computes_bit_for_bit(runs):
    win, plain = runs["window"], runs["plain"]
    for k in ("losses", "views", "error", "after_error", "thread"):
        assert win[k] == plain[k], k


def test_both_match_cpu(runs):
    win, cpu = runs["window"], runs["cpu"]
    assert win["losses"] == pytest.approx(cpu["losses"], rel=1e-4, abs=1e-5)
    assert win["views"][0] == pytest.approx(cpu["views"][0])
    assert win["views"][1] == cpu["views"][1]
    assert win["views"][2] == pytest.approx(cpu["views"][2], rel=1e-5)
    assert win["error"] is True and cpu["error"] is True
    assert win["after_error"] == cpu["after_error"] == 12.0
    assert win["thread"] == pytest.approx(cpu["thread"], rel=1e-5)


def test_new_programs_compile_ahead_and_warm_steps_open_no_window(runs):
    win, plain = runs["window"]["counters"], runs["plain"]["counters"]
    # the same programs, each compiled once
    assert win["executables_compiled"] == plain["executables_compiled"]
    assert win["programs.op.xla_compiles"] == plain["programs.op.xla_compiles"]
    assert "window.opened" not in plain and "compile.ahead" not in plain
    # nearly every new program compiled on a worker while later ops were traced
    assert win["compile.ahead"] >= 0.9 * win["programs.op.xla_compiles"]
    assert win["compile.ahead_hits"] >= 0.9 * win["compile.ahead"]
    windows = runs["window"]["windows"]
    # the first step opens a window (the second may: AdamW's step count has a program of
    # its own once it is past 1); the last two steps run Strict's cached programs only
    assert windows[0] >= 1 and windows[3] == windows[1]
