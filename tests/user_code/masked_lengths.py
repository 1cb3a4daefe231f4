"""Vectors whose length is data, as TRL's GRPO logs them, written for CUDA: each step picks
the lengths of the completions that ended with a boolean mask (`lengths[~truncated]`,
as many as the data says), logs their mean, min and max, and writes the end positions
with `eos_idx[mask] = argmax(...)[mask]`. Then a few uses of a selection that must keep
torch's semantics: a view of a copy's destination, an in-place write, a sum and a
gradient.

tests/modes/test_growing.py runs it after `s/cuda/tpu/g` and as written with FORCE_CPU=1;
it prints "RESULT {json}": each step's logged values and the programs it built.
"""
import json
import os

import torch

device = "cpu" if os.environ.get("FORCE_CPU") else "cuda"


def programs():
    if device == "cpu":
        return 0
    kinds = torch.cuda.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


g = torch.Generator().manual_seed(0)
logged, built = [], []
for step in range(int(os.environ.get("STEPS", "10"))):
    before = programs()
    lengths = torch.randint(1, 7, (16,), generator=g).to(device)
    truncated = (torch.rand(16, generator=g) < 0.5).to(device)
    is_eos = (torch.rand(16, 6, generator=g) < 0.3).to(device)
    eos_idx = torch.full((16,), 6, dtype=torch.long, device=device)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    ended = lengths[~truncated]
    scores = (lengths.to(torch.bfloat16) / 7)[~truncated]  # a 16-bit mean, as torch rounds it
    logged.append([len(ended), ended.float().mean().item() if len(ended) else None,
                   scores.mean().item() if len(ended) else None,
                   ended.float().min().item() if len(ended) else None,
                   ended.max().item() if len(ended) else None, ended.sum().item(),
                   eos_idx.tolist(), ended.tolist()])
    built.append(programs() - before)

# a copy's destination that another tensor views keeps its storage
picked = lengths[lengths > 2].float()
out = torch.empty_like(picked)
head = out[:1]
out.copy_(picked * 2)
# an in-place write into a selection, then its values
picked.add_(1)
w = torch.ones(16, device=device, requires_grad=True)
(w[lengths > 3] * 3).sum().backward()
print("RESULT " + json.dumps({
    "rank": 0, "logged": logged, "programs": built, "head": head.tolist(),
    "picked": picked.tolist(), "out": out.tolist(), "grad": w.grad.tolist()}))
