"""A DDP training script written for CUDA the way public DDP tutorials write it
(pytorch/examples, the PyTorch DDP tutorial): LOCAL_RANK device strings, set_device,
a device-count guard, init_process_group(device_id=...), DDP(device_ids=[local_rank]).
tests/distributed/test_torchrun_idioms.py runs it with "cuda" -> "tpu" and "nccl" -> "tpu_dist"
(the only edit), and with FORCE_CPU=1 on gloo for the reference losses."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    use_accel = torch.cuda.is_available() and not os.environ.get("FORCE_CPU")
    if use_accel:
        if torch.accelerator.device_count() < world_size:
            print(f"not enough devices: {torch.accelerator.device_count()} < {world_size}")
            sys.exit(0)
        device = torch.device(f"cuda:{local_rank}")
        if os.environ.get("SET_DEVICE_API") == "accelerator":
            torch.accelerator.set_device_index(local_rank)
        else:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(local_rank if use_accel else device)
    ddp = DDP(model, device_ids=[local_rank] if use_accel else None,
              output_device=local_rank if use_accel else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(4):
        x = torch.randn(8, 16, generator=g).to(device)
        y = torch.randint(0, 4, (8,), generator=g).to(device)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if use_accel:
        torch.cuda.synchronize()
    params = [p.detach().cpu().sum().item() for p in model.parameters()]
    out = {"rank": rank, "losses": losses, "params": params,
           "device": str(next(model.parameters()).device),
           "current": torch.cuda.current_device() if use_accel else None}
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
