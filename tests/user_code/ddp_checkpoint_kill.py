"""A DDP training script written for CUDA as training scripts usually are: LOCAL_RANK
device, NCCL, DDP(device_ids=...), AdamW, and rank 0 checkpointing the model's and the
optimizer's state_dict with torch.save every few steps (to a temporary file, then an
atomic rename, so a crash mid-save leaves the previous checkpoint). After training, a
loop of collectives (all_reduce, broadcast, all_gather_into_tensor) with no read between
them, as an evaluation or metrics phase has.

tests/distributed/test_distributed_faults.py runs it with "cuda" -> "tpu" and "nccl" -> "tpu_dist"
(the only edit) on 4 processes and SIGKILLs one rank during training or inside the loop
of collectives: the others must stop within seconds, naming the killed rank, and the
last checkpoint must load with exactly the values an uninterrupted run had at that step.

Environment: CKPT_DIR (where checkpoints and progress files go), KEEP_ALL=1 (also keep
every checkpoint as step<N>.pt: the reference), STEPS, COLLECTIVE_ITERS.
"""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "30"))
CKPT_EVERY = 3
COLLECTIVE_ITERS = int(os.environ.get("COLLECTIVE_ITERS", "3000"))


def save_checkpoint(model, opt, step, ckpt_dir, keep_all):
    state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
    tmp = os.path.join(ckpt_dir, "last.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(ckpt_dir, "last.pt"))
    if keep_all:
        torch.save(state, os.path.join(ckpt_dir, f"step{step}.pt"))


def progress(ckpt_dir, rank, text):
    with open(os.path.join(ckpt_dir, f"progress{rank}.tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(ckpt_dir, f"progress{rank}.tmp"),
               os.path.join(ckpt_dir, f"progress{rank}"))


def main():
    ckpt_dir = os.environ["CKPT_DIR"]
    keep_all = os.environ.get("KEEP_ALL") == "1"
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).to(device)
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 32, generator=g).to(device, non_blocking=True)
        loss = F.mse_loss(ddp(x), x.flip(1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % CKPT_EVERY == 0:
            if rank == 0:
                save_checkpoint(model, opt, step, ckpt_dir, keep_all)
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        progress(ckpt_dir, rank, f"train {step}")

    # a metrics phase: collectives back to back, nothing read until the end
    t = torch.full((4096,), float(rank), device=device)
    gathered = torch.empty(world * 4096, device=device)
    for i in range(COLLECTIVE_ITERS):
        dist.all_reduce(t)
        t.div_(world)
        dist.broadcast(t, src=i % world)
        dist.all_gather_into_tensor(gathered, t)
        if i == world:  # every program of the loop (a broadcast per root) compiled and running
            progress(ckpt_dir, rank, "collectives")
    torch.cuda.synchronize()
    print("RESULT " + json.dumps({"rank": rank, "sum": gathered.sum().item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
