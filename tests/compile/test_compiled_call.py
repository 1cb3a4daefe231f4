"""A compiled graph's call fast paths (compile/program.py Program.__call__) against their
Python reference, TORCH_TPU_C_FAST_PATH=0: program_scan's memo of the last layout (a call
laid out the same reuses the last executable, key neither built nor hashed) and
program_results (the output tensors made in C). The same user script runs both ways, in
DeferAndFuse too, and on CPU: same numbers, same output layouts, the input returned as
itself; a sliding view (its offset passed as data) and a change of shape both keep their
right answers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

_SCRIPT = r"""
import json, sys, torch
dev = sys.argv[1]
if dev == "tpu":
    import torch_tpu
    from torch_tpu import metrics
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
backend = "tpu" if dev == "tpu" else "aot_eager"
fwd, step = torch.compile(model, backend=backend), torch.compile(opt.step, backend=backend)
x, y = torch.randn(32, 8).to(dev), torch.randn(32, 4).to(dev)
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(fwd(x), y)
    loss.backward()
    step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())

@torch.compile(backend=backend, dynamic=False)
def outs(a, w):
    h = a @ w
    return a, h.t() * 2, h.sum(0), (h > 0).to(torch.int32)

buf = torch.arange(40, dtype=torch.float32).to(dev) / 7
w = torch.randn(4, 3).to(dev)
seen = []
for i in (0, 4, 8, 8, 12):  # one view of a sliding window: its offset changes, its layout not
    a = buf[i:i + 20].view(5, 4)
    r = outs(a, w)
    seen.append({"same": r[0] is a, "vals": [t.cpu().tolist() for t in r[1:]],
                 "layouts": [(tuple(t.shape), t.stride(), str(t.dtype)) for t in r[1:]]})
r = outs(buf[:24].view(6, 4), w)  # another shape: another executable
seen.append({"same": r[0].shape == (6, 4), "vals": [t.cpu().tolist() for t in r[1:]],
             "layouts": [(tuple(t.shape), t.stride(), str(t.dtype)) for t in r[1:]]})
counts = {k: metrics.counters[k] for k in ("compile.same_layout", "compile.executables")} if dev == "tpu" else {}
print(json.dumps({"losses": losses, "seen": seen, "counts": counts}))
"""


def _run(dev, fast="1", **env_extra):
    env = dict(os.environ, TORCH_TPU_C_FAST_PATH=fast, TORCH_TPU_RECOMPILE_WARN="0", **env_extra)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, dev], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # four fresh processes, each compiling
def test_fast_paths_match_their_python_reference_and_cpu():
    fast, ref, cpu = _run("tpu", "1"), _run("tpu", "0"), _run("cpu")
    defer = _run("tpu", "1", TORCH_TPU_DEFER_AND_FUSE="1")  # the eager ops around, deferred
    assert fast["losses"] == ref["losses"]
    assert fast["seen"] == ref["seen"]
    for run in (fast, defer):
        for a, b in zip(run["losses"], cpu["losses"]):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (run["losses"], cpu["losses"])
        for mine, theirs in zip(run["seen"], cpu["seen"]):
            assert mine["same"] and mine["layouts"] == theirs["layouts"]
            for v, w in zip(mine["vals"], theirs["vals"]):
                torch.testing.assert_close(torch.tensor(v, dtype=torch.float64),
                                           torch.tensor(w, dtype=torch.float64), rtol=1e-5, atol=1e-5)
        # the memo served every call after each graph's first, and no extra executable was
        # built: forward, backward and AdamW from the second step on (3 x 4), the window
        # after its first call (4, the offset passed as data); a new shape misses it
        assert run["counts"]["compile.same_layout"] == 3 * 4 + 4, run["counts"]
        assert run["counts"]["compile.executables"] == ref["counts"]["compile.executables"]
    assert ref["counts"]["compile.same_layout"] == 0
