"""What the tpu_dist examples share: small HF Llama/Qwen2 models from configs (the decoder
workload of torch_tpu_tools, installed with torch_tpu), a fixed global batch, the
single-process reference run, and the loss check.

Every example trains the same model from the same initial weights on the same global
batch; a parallel run must reproduce the losses of one process training on the whole
batch (`--check` compares them and exits non-zero otherwise).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from torch_tpu_tools.workloads import decoder

VOCAB, SEQ = 128, 16


def parse_args(description: str, default_batch: int = 8, extra=None) -> argparse.Namespace:
    """The examples' common flags; `extra(parser)` adds an example's own."""
    p = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(p)
    p.add_argument("--model", choices=["llama", "qwen"], default="llama")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=default_batch, help="global batch size")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--check", action="store_true",
                   help="compare the losses with a single-process CPU run of the global batch")
    p.add_argument("--save", default=None, help="torch.save the model state here (rank 0) "
                                                "after every step")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    return p.parse_args()


def init() -> tuple[int, int]:
    """Join the job (torchrun's environment, or RANK/WORLD_SIZE/MASTER_* set by hand)."""
    import torch_tpu  # noqa: F401  (registers the tpu device and the tpu_dist backend)
    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist")
    return dist.get_rank(), dist.get_world_size()


def spec(kv_heads: int = 2, batch: int = 8) -> decoder.DecoderSpec:
    """hidden 64, 2 layers, 4 heads, seed 0: the same weights on every rank."""
    return decoder.DecoderSpec(vocab=VOCAB, seq=SEQ, batch=batch, kv_heads=kv_heads)


def build(kind: str, kv_heads: int = 2) -> torch.nn.Module:
    """A 2-layer model on CPU with weights fixed by the seed (same on every rank)."""
    return decoder.build_model(spec(kv_heads), "qwen2" if kind == "qwen" else "llama")


def batches(steps: int, batch: int) -> list:
    return decoder.random_batches(spec(batch=batch), [SEQ] * steps)


def shard(x: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """This data-parallel rank's slice of the global batch."""
    per = x.shape[0] // count
    return x[index * per:(index + 1) * per]


def reference(args, kv_heads: int = 2) -> list:
    """Losses of one process training on the whole global batch, on CPU."""
    model = build(args.model, kv_heads)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    out = []
    for x in batches(args.steps, args.batch):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def global_loss(loss: torch.Tensor, group=None) -> float:
    """The mean of the ranks' losses (each over an equal share of the batch)."""
    t = loss.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
    return t.item()


def finish(args, rank: int, losses: list, kv_heads: int = 2, tag: str = "") -> None:
    """Print the losses; with --check, compare with the reference and exit 1 on mismatch."""
    print(f"[rank {rank}] {tag} losses: {[round(v, 5) for v in losses]}", flush=True)
    ok = True
    if args.check:
        ref = reference(args, kv_heads)
        worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, ref))
        ok = worst <= 2e-3
        print(f"[rank {rank}] {tag} reference: {[round(v, 5) for v in ref]} "
              f"max rel diff {worst:.2e} -> {'MATCH' if ok else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def save(model: torch.nn.Module, path: str, step: int) -> None:
    """Rank 0 writes the full state (host copies) atomically, then says which step."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tmp = path + ".tmp"
    torch.save({"step": step, "model": state}, tmp)
    os.replace(tmp, path)


def tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """Megatron-style TP on every decoder layer (decoder.tensor_parallel)."""
    decoder.tensor_parallel(model, tp_mesh)
