"""Writes into part of a large preallocated buffer, written for CUDA: TRL's chunked
log-prob (`torch.empty` of (tokens, 32768), then `torch.mm(..., out=tile)` into a corner
and reads of it), slice assignment, a ring buffer written a row at a time, an integer
buffer, and the aliasing a write must respect: a clone taken before, a host copy taken
before, a view alive across the write.

tests/modes/test_partial_writes.py runs it after `s/cuda/tpu/g` and as written with
FORCE_CPU=1; it prints "RESULT {json}": each step's values, and on tpu how many writes
ran in place (Strict) and how many graphs read a written view back as its value
(DeferAndFuse): torch_tpu.metrics' `writes_in_place` and `fused_forwarded_reads`.
"""
import json
import os

import torch

device = "cpu" if os.environ.get("FORCE_CPU") else "cuda"
g = torch.Generator().manual_seed(0)
h = torch.randn(40, 32, generator=g).to(device)
w = torch.randn(16, 32, generator=g).to(device)
rows = torch.randn(8, 40, generator=g).to(device)
steps = []
for step in range(int(os.environ.get("STEPS", "4"))):
    out = {}
    buf = torch.empty((40, 32768), device=device)  # 5 MB, as TRL's mm_buf
    tile = buf[:, :16]
    torch.mm(h, w.t() * (step + 1), out=tile)
    out["tile"] = tile.exp().sum().item()
    buf[:, 100:116] = tile * 2                     # slice assignment
    buf[5:10, 200:216].copy_(tile[:5])             # a view at an offset
    kept = buf.clone()                             # a copy taken before the next write
    host = buf[:, :16].cpu()                       # a host copy taken before it
    view = buf[:, 100:116]                         # a view alive across it
    buf[:, 100:116] = -tile
    out["after"] = [buf[:, :16].sum().item(), view.sum().item(), buf[5:10, 200:216].sum().item()]
    out["kept"] = [kept[:, 100:116].sum().item(), host.sum().item()]
    ring = torch.zeros((40, 8192), device=device)  # a ring buffer, a row at a time
    for i in range(8):
        ring[:, (step * 8 + i) % 8192] = rows[i]
    out["ring"] = ring.sum(0)[:16].tolist()
    ids = torch.empty((40, 32768), dtype=torch.long, device=device)
    ids[:, :16] = torch.arange(16, device=device) + step
    out["ids"] = ids[:, :16].sum().item()
    steps.append(out)

counts = None
if device != "cpu":
    import torch_tpu
    counts = {k: torch_tpu.metrics.as_dict()["counters"].get(k, 0)
              for k in ("writes_in_place", "fused_forwarded_reads")}
print("RESULT " + json.dumps({"rank": 0, "steps": steps, "counts": counts}))
