"""Compiled graphs under DeferAndFuse: each call records as one pending node, so a training
step's forward, backward and optimizer graphs and the eager ops between them flush as one
program (eager/defer.py record_graph, compile/program.py Program._record). A user's
script (CUDA idioms: a compiled model and a compiled AdamW step, gradient clipping, a
loss read every step, a gradient read mid-step) runs on tpu in DeferAndFuse and Strict
and on CPU: the same numbers, and in DeferAndFuse one flush and one cached program per
step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, sys, torch
dev = sys.argv[1]
if dev == "tpu":
    import torch_tpu
    from torch_tpu import metrics
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Dropout(0.0),
                            torch.nn.Linear(32, 4)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
backend = "tpu" if dev == "tpu" else "aot_eager"
fwd, step = torch.compile(model, backend=backend), torch.compile(opt.step, backend=backend)
g = torch.Generator().manual_seed(1)
data = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(8)]
losses, norms, grads, per_step = [], [], [], []
for i, (x, y) in enumerate(data):
    x, y = x.to(dev), y.to(dev)
    loss = torch.nn.functional.mse_loss(fwd(x), y)
    loss.backward()
    if i == 5:  # a gradient read between backward and step: its pending program runs
        grads.append(model[0].weight.grad.sum().item())
    norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
    if dev == "tpu":
        c = metrics.counters
        flushes = sum(v for k, v in c.items() if k.startswith("flush."))
        per_step.append([flushes] + [c[k] for k in ("fused_graphs_compiled",
                                                    "dispatches.compiled_graphs")])
norms = [float(n) for n in norms]
print(json.dumps({"losses": losses, "norms": norms, "grads": grads, "per_step": per_step,
                  "weight": model[3].weight.detach().cpu().tolist()}))
"""


def _run(dev, **env):
    env = dict(os.environ, TORCH_TPU_RECOMPILE_WARN="0", **env)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, dev], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _close(a, b, tol=1e-5):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        if isinstance(u, list):
            _close(u, v, tol)
        else:
            assert abs(u - v) <= tol * max(1.0, abs(v)), (a, b)


@pytest.mark.slow  # three fresh processes, each compiling
def test_a_compiled_training_step_flushes_as_one_program_with_cpu_numbers():
    cpu = _run("cpu")
    strict = _run("tpu")
    defer = _run("tpu", TORCH_TPU_DEFER_AND_FUSE="1")
    for run in (strict, defer):
        for k in ("losses", "norms", "grads", "weight"):
            _close(run[k], cpu[k])
    # from the third step on (the first two build what the later ones reuse): the
    # three graphs record, one flush (the optimizer step's end) runs them with the
    # clipping's eager ops, from one cached program; step 5's gradient read flushes once more, its two
    # graphs (the step before and after the read) compiled once
    steady = [b[j] - a[j] for a, b in zip(defer["per_step"][2:], defer["per_step"][3:])
              for j in range(3)]
    deltas = [steady[i:i + 3] for i in range(0, len(steady), 3)]
    for i, d in enumerate(deltas, start=3):
        assert d == [1, 0, 3] or (i == 5 and d == [2, 2, 3]), deltas
    assert strict["per_step"][-1][2] == 0  # Strict runs each graph at once
