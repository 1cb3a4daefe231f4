"""2-D parallel training (data parallel x tensor parallel) of a small HF Llama or Qwen2.

    torchrun --nproc-per-node=4 examples/dp_tp_2d.py --model llama --check

A (dp, tp) device mesh: tensor parallelism inside each "tp" row (the attention and MLP
projections split as in tp.py), FSDP2 across the "dp" column (fully_shard on the dp
sub-mesh shards what TP left whole). Each dp rank trains on its share of the batch.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import common


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rank, world = common.init()
    tp = 2 if world % 2 == 0 else 1
    dp = world // tp
    mesh = init_device_mesh("tpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = common.build(args.model).to("tpu")
    common.tensor_parallel(model, mesh["tp"])
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    dp_rank = mesh.get_local_rank("dp")
    losses = []
    for x in common.batches(args.steps, args.batch):
        x = common.shard(x, dp_rank, dp).to("tpu")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(common.global_loss(loss, mesh.get_group("dp")))
    common.finish(args, rank, losses, tag=f"dp{dp} x tp{tp} {args.model}")


if __name__ == "__main__":
    main()
