"""A training loop in a process that holds almost all the memory mappings Linux allows it
(vm.max_map_count: a data loader's memory-mapped shards, say). Written for CUDA.

Trains a step, maps small anonymous regions until LEAVE mappings are left, runs new
programs (which cannot be mapped: on tpu a clear error, never a crash or a hang), releases
the regions, and trains on. FORCE_CPU=1 runs it on the CPU (no mapping pressure there).
Prints "RESULT {json}": the losses and the error met while the mappings were exhausted.
"""
import gc
import json
import mmap
import os

import torch
from torch import nn

device = "cpu" if os.environ.get("FORCE_CPU") == "1" else "cuda"
LEAVE = int(os.environ.get("LEAVE", "150"))


def mappings():
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16).to(device), torch.randn(8, 4).to(device)


def step():
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


losses = [step()]
error = None
if device == "cuda":
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    held = []  # alternating protections, so that neighbours do not merge into one mapping
    while mappings() < limit - LEAVE:
        for _ in range(max(1, min(1000, (limit - LEAVE - mappings()) // 2))):
            prot = mmap.PROT_READ if len(held) % 2 else mmap.PROT_READ | mmap.PROT_WRITE
            held.append(mmap.mmap(-1, mmap.PAGESIZE, prot=prot))
    try:
        for n in range(1, 40):  # new shapes: new programs
            torch.ones(n, n + 1, device=device).sum().item()
    except RuntimeError as e:
        error = f"{type(e).__name__}: {e}"
    del held
    gc.collect()
for _ in range(3):
    losses.append(step())
print("RESULT " + json.dumps({"rank": 0, "losses": losses, "error": error}))
