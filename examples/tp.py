"""Tensor parallel training of a small HF Llama or Qwen2 on a 1-D device mesh.

    torchrun --nproc-per-node=2 examples/tp.py --model qwen --check

`init_device_mesh("tpu", (N,))` and `parallelize_module` with ColwiseParallel /
RowwiseParallel on the attention and MLP projections, exactly as on GPUs. Every rank sees
the whole batch and holds 1/N of each projection; DTensor inserts the collectives (as
functional collectives on tpu tensors).
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

import common


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    rank, world = common.init()
    kv_heads = 2 if world <= 2 else world  # heads must split evenly over the ranks
    mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
    model = common.build(args.model, kv_heads).to("tpu")
    common.tensor_parallel(model, mesh)
    # foreach=False: the optimizer then steps DTensor (sharded) and plain (replicated)
    # parameters one by one; torch's foreach kernels refuse to mix the two.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    losses = []
    for x in common.batches(args.steps, args.batch):
        x = x.to("tpu")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(common.global_loss(loss))
    common.finish(args, rank, losses, kv_heads, tag=f"tp {args.model} x{world}")


if __name__ == "__main__":
    main()
