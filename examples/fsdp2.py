"""Fully sharded data parallel (FSDP2, `fully_shard`) training of a small HF Llama or Qwen2.

    torchrun --nproc-per-node=2 examples/fsdp2.py --model llama --check [--sum-gradients]

Each decoder layer and then the whole model are sharded over the ranks: parameters,
gradients and optimizer state live as 1/N shards (DTensors on tpu); a layer's weights are
all-gathered just before it runs and its gradients reduce-scattered after backward.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import common


def _flags(p) -> None:
    p.add_argument("--sum-gradients", action="store_true",
                   help="torchtitan's setting: set_gradient_divide_factor(1.0), so FSDP2 "
                        "reduce-scatters gradients with ReduceOp.PREMUL_SUM, and the loss "
                        "divided by the number of ranks instead")


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra=_flags)
    rank, world = common.init()
    mesh = init_device_mesh("tpu", (world,))
    model = common.build(args.model).to("tpu")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if args.sum_gradients:
        model.set_gradient_divide_factor(1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for x in common.batches(args.steps, args.batch):
        x = common.shard(x, rank, world).to("tpu")
        loss = model(input_ids=x, labels=x).loss
        (loss / world if args.sum_gradients else loss).backward()
        opt.step()
        opt.zero_grad()
        losses.append(common.global_loss(loss))
    common.finish(args, rank, losses, tag=f"fsdp2 {args.model} x{world}")


if __name__ == "__main__":
    main()
