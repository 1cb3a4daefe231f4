"""A CUDA-style DDP script that shares a config between ranks before it trains, as many do
(a vocabulary or run config pickled with `broadcast_object_list`, per-rank stats with
`gather_object`, each rank's shard of an index with `scatter_object_list`, as a DCP
checkpoint load does too): small object collectives first, then 4 MB of gradients a step.
tests/distributed/test_collective_sockets.py runs it with `cuda` -> `tpu`, `nccl` -> `tpu_dist`
against the same script on CPU over gloo. Prints `RESULT {json}` per rank."""
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

cpu = os.environ.get("FORCE_CPU") == "1"
dist.init_process_group("gloo" if cpu else "nccl")
rank = dist.get_rank()
device = torch.device("cpu") if cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
if not cpu:
    torch.cuda.set_device(device)

config = [{"vocab": {f"token{i}": i for i in range(600)}, "lr": 0.05}] if rank == 0 else [None]
dist.broadcast_object_list(config, src=0)
stats = [None] * dist.get_world_size() if rank == 0 else None
dist.gather_object({"rank": rank, "host": "x" * 9000}, stats, dst=0)
shard = [None]
dist.scatter_object_list(shard, [{"rows": list(range(r, 3000, 2))} for r in range(2)]
                         if rank == 0 else None, src=0)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 1)).to(device)
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=config[0]["lr"])
gen = torch.Generator().manual_seed(1 + rank)
losses, t0 = [], None
for step in range(int(os.environ.get("STEPS", "20"))):
    if step == 2:
        t0 = time.perf_counter()  # after the first steps' compiles
    x = torch.randn(8, 1024, generator=gen).to(device)
    loss = ddp(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
seconds = time.perf_counter() - t0
weight = model[0].weight.detach().float().sum().item()
print("RESULT " + json.dumps({"rank": rank, "losses": losses, "weight": weight,
                              "seconds": seconds, "vocab": len(config[0]["vocab"]),
                              "rows": shard[0]["rows"][:2] + [len(shard[0]["rows"])]}), flush=True)
dist.destroy_process_group()
