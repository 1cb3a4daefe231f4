"""The TorchTPU idiom: every process puts everything on "tpu:0" (each process drives one
device and calls it tpu:0), with no set_device and no device_ids; tensors made on "tpu"
and "tpu:0" are mixed on purpose. Run by tests/distributed/test_torchrun_idioms.py."""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

device = torch.device("cpu" if os.environ.get("FORCE_CPU") else "tpu:0")
dist.init_process_group("gloo" if device.type == "cpu" else "tpu_dist")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
losses = []
other = torch.device("cpu" if device.type == "cpu" else "tpu")  # the other spelling
for step in range(4):
    x = torch.randn(8, 16, generator=g).to(device)
    y = torch.randint(0, 4, (8,), generator=g).to(other)
    loss = F.cross_entropy(model(x), y) + torch.zeros((), device=other)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
params = [p.detach().cpu().sum().item() for p in model.parameters()]
print("RESULT " + json.dumps({"rank": rank, "losses": losses, "params": params}), flush=True)
dist.destroy_process_group()
