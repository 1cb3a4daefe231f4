"""DDP, FSDP2 and tensor parallelism as a CUDA script writes them under torchrun
(`cuda:{LOCAL_RANK}`, set_device, init_device_mesh, fully_shard, parallelize_module),
with "cuda" -> "tpu" and "nccl" -> "tpu_dist" the only edit. Each strategy trains a small
MLP for a few steps; every rank also trains the same MLP on the whole batch on the CPU,
the single-process reference the parallel run must reproduce. Each rank prints its results
as one `RESULT {json}` line. tests/distributed/test_binding_devices.py runs it with
several devices visible per process (XLA_FLAGS=--xla_force_host_platform_device_count=N).
With CHECK_BUFFERS=1 a rank also reports the JAX device behind its tensors (a test's
introspection, not the user's code)."""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STEPS, BATCH = 3, 8


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(STEPS)]


def train(model, params, data, device, shard=None, foreach=None):
    opt = torch.optim.SGD(params, lr=0.1, foreach=foreach)
    losses = []
    for x, y in data:
        if shard is not None:
            x, y = x.chunk(shard[1])[shard[0]], y.chunk(shard[1])[shard[0]]
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in losses]


def full(t):
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches()

    ref = make_model()
    ref_losses = train(ref, ref.parameters(), data, "cpu")
    want = [p.detach() for p in ref.parameters()]

    out = {"rank": rank, "ref_losses": ref_losses, "strategies": {}}
    mesh = init_device_mesh("cuda", (world,))
    for name in ("ddp", "fsdp2", "tp"):
        model = make_model().to(device)
        if name == "ddp":
            run = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
            losses = train(run, run.parameters(), data, device, (rank, world))
        elif name == "fsdp2":
            for layer in (model[0], model[2], model[4]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            losses = train(model, model.parameters(), data, device, (rank, world))
        else:
            parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            # (the last layer stays a plain tensor: the foreach kernels refuse the mix)
            losses = train(model, model.parameters(), data, device, foreach=False)
        if name != "tp":  # (a shard's mean loss; the whole batch's is the all-reduced mean)
            t = torch.tensor(losses, device=device)
            dist.all_reduce(t)
            losses = (t / world).tolist()
        got = [full(p) for p in model.parameters()]
        out["strategies"][name] = {
            "losses": losses,
            "max_param_diff": max(float((g - w).abs().max()) for g, w in zip(got, want)),
            "device": str(next(model.parameters()).device),
        }
    props = torch.cuda.get_device_properties(local_rank)
    out["device_id"] = props.device_id
    out["current"] = torch.cuda.current_device()
    out["count"] = torch.cuda.device_count()
    if os.environ.get("CHECK_BUFFERS"):
        from torch_tpu import _runtime, _storage

        t = torch.ones(4, device=device) + torch.randn(4, device=device)
        torch.cuda.synchronize()
        buf = _storage.record(t.untyped_storage(), t.dtype)[0]
        out["buffer_devices"] = sorted(d.id for d in buf.devices())
        out["runtime_device"] = _runtime.device().id
        out["local_devices"] = [d.id for d in __import__("jax").local_devices()]
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
