"""Data parallel training of a small HF Llama or Qwen2 with DistributedDataParallel.

    torchrun --nproc-per-node=2 examples/ddp.py --model qwen --check

The only change from a GPU script: "tpu_dist" instead of "nccl" and device "tpu". Each
rank trains on its share of the global batch; DDP all-reduces the gradients (one XLA
collective per bucket) so every rank takes the same optimizer step.
"""
from __future__ import annotations

import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import common


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rank, world = common.init()
    model = DDP(common.build(args.model).to("tpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step, x in enumerate(common.batches(args.steps, args.batch)):
        x = common.shard(x, rank, world).to("tpu")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(common.global_loss(loss))
        if args.save and rank == 0:
            common.save(model.module, args.save, step)
        time.sleep(args.sleep)
    common.finish(args, rank, losses, tag=f"ddp {args.model} x{world}")


if __name__ == "__main__":
    main()
