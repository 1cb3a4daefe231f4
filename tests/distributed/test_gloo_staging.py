"""tpu tensors over a gloo process group, as CUDA tensors work over one: every c10d
collective, DDP, functional collectives and DTensor tensor parallelism over a gloo group,
each giving what the same script gives with CPU tensors.

This file is also the user's script (`python tests/distributed/test_gloo_staging.py --worker DEVICE`):
a gloo job whose only device-specific line is the device string. It runs as 2 processes
on 127.0.0.1 (helpers/dist_launch.py, an env:// rendezvous as torchrun sets it up), with
"cpu", with "tpu" and with "tpu" in DeferAndFuse; each rank reports every check's result,
and the tests compare each tpu run with the CPU run value for value (small integers and
sums of them: exact). transformers' tensor parallelism picks the accelerator itself, so
that check runs on tpu in every run and compares with a single-process CPU model.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import traceback

import pytest

from helpers.dist_launch import HERE, launch, report


WORLD = 2
JOB_TIMEOUT_S = 420


# ---------------------------------------------------------------- the user's script
def _collectives(dev, rank, world):
    """name -> a check returning JSON-able results."""
    import torch
    import torch.distributed as dist

    def ints(n=6, dtype=torch.float32):
        return (torch.arange(n) % 3 + 1 + rank).to(dtype).to(dev)

    def all_reduce(op, dtype):
        def run():
            t = ints(dtype=dtype)
            dist.all_reduce(t, op=op)
            return [t.device.type, t.tolist()]
        return run

    def all_reduce_async():
        t = ints()
        work = dist.all_reduce(t, async_op=True)
        ok = work.wait()
        fut = work.get_future().value()  # DDP's reducer reads its bucket from the future
        return [ok, work.is_completed(), t.tolist(), fut[0].device.type, fut[0] is t]

    def all_reduce_view():
        base = torch.zeros(4, 3, device=dev)
        view = base[1:3]  # a view at an offset: the result must land in base
        view.copy_(ints().view(2, 3))
        dist.all_reduce(view)
        return base.tolist()

    def all_reduce_param():
        p = torch.nn.Parameter(ints())  # a leaf that requires grad, as DDP's params
        v = p._version
        dist.all_reduce(p.data)
        return [p.tolist(), p.requires_grad, p._version == v]

    def broadcast():
        t = ints()
        dist.broadcast(t, src=1)
        return t.tolist()

    def reduce():
        t = ints()
        dist.reduce(t, dst=0)
        return t.tolist() if rank == 0 else None

    def all_gather():
        outs = [torch.zeros(6, device=dev) for _ in range(world)]
        dist.all_gather(outs, ints())
        return [o.tolist() for o in outs]

    def all_gather_into_tensor():
        out = torch.zeros(world * 6, device=dev)
        dist.all_gather_into_tensor(out, ints())
        return out.tolist()

    def all_gather_into_tensor_inplace():
        # FSDP's layout: the input is this rank's slice of the output
        out = torch.zeros(world * 3, device=dev)
        mine = out.narrow(0, rank * 3, 3)
        mine.copy_(ints(3))
        dist.all_gather_into_tensor(out, mine)
        return out.tolist()

    def reduce_scatter():
        out = torch.zeros(3, device=dev)
        dist.reduce_scatter(out, [ints(3) * (i + 1) for i in range(world)])
        return out.tolist()

    def reduce_scatter_tensor():
        out = torch.zeros(3, device=dev)
        dist.reduce_scatter_tensor(out, ints(3 * world))
        return out.tolist()

    def gather():
        outs = [torch.zeros(6, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(ints(), outs, dst=0)
        return [o.tolist() for o in outs] if rank == 0 else None

    def scatter():
        out = torch.zeros(6, device=dev)
        ins = [ints() * (i + 1) for i in range(world)] if rank == 0 else None
        dist.scatter(out, ins, src=0)
        return out.tolist()

    def all_to_all_single():
        out = torch.zeros(6, device=dev)
        dist.all_to_all_single(out, ints() * 10 + torch.arange(6.0, device=dev))
        return out.tolist()

    def all_to_all_single_uneven():
        # rank r sends r + 1 + j rows to rank j
        send = [rank + 1 + j for j in range(world)]
        recv = [r + 1 + rank for r in range(world)]
        inp = torch.arange(sum(send), dtype=torch.float32, device=dev) + 100 * rank
        out = torch.zeros(sum(recv), device=dev)
        dist.all_to_all_single(out, inp, recv, send)
        return out.tolist()

    def all_to_all():
        outs = [torch.zeros(2, device=dev) for _ in range(world)]
        dist.all_to_all(outs, [ints(2) * (i + 1) for i in range(world)])
        return [o.tolist() for o in outs]

    def barrier():
        dist.barrier()
        dist.barrier(device_ids=[rank])  # a barrier on the accelerator's tensor
        return "ok"

    def send_recv():
        t = ints() if rank == 0 else torch.zeros(6, device=dev)
        if rank == 0:
            dist.send(t, dst=1)
        else:
            dist.recv(t, src=0)
        return t.tolist()

    def recv_any_source():
        t = ints() if rank == 1 else torch.zeros(6, device=dev)
        if rank == 1:
            dist.send(t, dst=0)
            return None
        src = dist.recv(t)
        return [src, t.tolist()]

    def isend_irecv_both_receive_first():
        # every rank posts its receive before its send: a receive must not block
        peer = 1 - rank
        got = torch.zeros(6, device=dev)
        rw = dist.irecv(got, src=peer)
        sw = dist.isend(ints(), dst=peer)
        sw.wait()
        rw.wait()
        return got.tolist()

    def batch_isend_irecv():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.zeros(6, device=dev)
        ops = [dist.P2POp(dist.isend, ints() * 7, nxt), dist.P2POp(dist.irecv, got, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return got.tolist()

    # the coalesced forms (DDP's init broadcasts its state through broadcast_coalesced)
    def broadcast_coalesced():
        ts = [ints(3), ints(5, torch.int64), ints(2) * 2]
        dist._broadcast_coalesced(dist.group.WORLD, ts, 1 << 20, 1)
        return [t.tolist() for t in ts]

    def all_reduce_coalesced():
        ts = [ints(3), ints(4) * 2]
        dist.all_reduce_coalesced(ts)
        return [t.tolist() for t in ts]

    def all_gather_coalesced():
        outs = [[torch.zeros(3, device=dev), torch.zeros(2, device=dev)] for _ in range(world)]
        dist.all_gather_coalesced(outs, [ints(3), ints(2) * 5])
        return [[o.tolist() for o in lst] for lst in outs]

    def allgather_into_tensor_coalesced():
        pg = dist.group.WORLD
        outs = [torch.zeros(3 * world, device=dev), torch.zeros(2 * world, device=dev)]
        pg.allgather_into_tensor_coalesced(outs, [ints(3), ints(2) * 5]).wait()
        return [o.tolist() for o in outs]

    def objects():  # object collectives: host tensors, untouched by the staging
        got = [None] * world
        dist.all_gather_object(got, {"rank": rank})
        return got

    checks = {f"all_reduce[{op}-{dt}]": all_reduce(getattr(dist.ReduceOp, op),
                                                   getattr(torch, dt))
              for op in ("SUM", "MAX", "MIN", "PRODUCT") for dt in ("float32", "int64")}
    checks["all_reduce[BAND-int64]"] = all_reduce(dist.ReduceOp.BAND, torch.int64)
    for fn in (all_reduce_async, all_reduce_view, all_reduce_param, broadcast, reduce,
               all_gather, all_gather_into_tensor, all_gather_into_tensor_inplace,
               reduce_scatter, reduce_scatter_tensor, gather, scatter, all_to_all_single,
               all_to_all_single_uneven, all_to_all, barrier, send_recv, recv_any_source,
               isend_irecv_both_receive_first, batch_isend_irecv, broadcast_coalesced,
               all_reduce_coalesced, all_gather_coalesced, allgather_into_tensor_coalesced,
               objects):
        checks[fn.__name__] = fn
    return checks


def _functional(dev, rank, world):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    def ints(n=4):
        return (torch.arange(n) % 3 + 1 + rank).float().to(dev)

    def value(t):
        t = funcol.wait_tensor(t) if isinstance(t, funcol.AsyncCollectiveTensor) else t
        return [t.device.type, t.tolist()]

    def fn_all_reduce():
        return value(funcol.all_reduce(ints(), "sum", group))

    def fn_all_reduce_inplace():
        t = ints()
        r = torch.ops._c10d_functional.all_reduce_(t, "sum", group.group_name)
        funcol.wait_tensor(r)
        return [r is t, t.tolist()]

    def fn_all_gather_tensor():
        return value(funcol.all_gather_tensor(ints(), 0, group))

    def fn_reduce_scatter_tensor():
        return value(funcol.reduce_scatter_tensor(ints(2 * world), "sum", 0, group))

    def fn_all_to_all_single():
        return value(funcol.all_to_all_single(ints(2 * world), None, None, group))

    def fn_broadcast():
        return value(funcol.broadcast(ints(), 1, group))

    def fn_all_reduce_coalesced():
        return [value(t) for t in funcol.all_reduce_coalesced([ints(2), ints(3)], "max",
                                                              group)]

    def fn_all_gather_into_tensor_out():
        out = torch.zeros(4 * world, device=dev)
        r = torch.ops._c10d_functional.all_gather_into_tensor_out(ints(), world,
                                                                  group.group_name, out=out)
        funcol.wait_tensor(r)
        return [r is out, out.tolist()]

    def fn_grad_all_gather():  # the autograd form DTensor's backward uses
        x = ints().requires_grad_()
        y = funcol.all_gather_tensor_autograd(x, 0, group)
        (funcol.wait_tensor(y) * (1 + torch.arange(4.0 * world, device=dev))).sum().backward()
        return x.grad.tolist()

    return {f.__name__: f for f in (
        fn_all_reduce, fn_all_reduce_inplace, fn_all_gather_tensor, fn_reduce_scatter_tensor,
        fn_all_to_all_single, fn_broadcast, fn_all_reduce_coalesced,
        fn_all_gather_into_tensor_out, fn_grad_all_gather)}


def _models(dev, rank, world):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def net():
        torch.manual_seed(0)  # the same weights on every rank and either device
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 4))

    def batch(step):
        g = torch.Generator().manual_seed(100 * step + rank)
        return torch.randn(6, 8, generator=g).to(dev), torch.randn(6, 4, generator=g).to(dev)

    def train(model):
        """3 SGD steps; the rounded losses."""
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            x, y = batch(step)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 5))
        return losses

    def ddp():
        model = DDP(net().to(dev), bucket_cap_mb=1e-4)  # several buckets
        losses = train(model)
        return [losses, round(sum(p.sum().item() for p in model.parameters()), 4)]

    def fsdp2():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = net().to(dev)
        mesh = init_device_mesh(dev, (world,))
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
        return train(model)

    def dtensor_tensor_parallel():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh(dev, (world,))
        torch.manual_seed(1)
        full = torch.randn(4, 6)
        d = distribute_tensor(full.to(dev), mesh, [Shard(0)])
        gathered = d.redistribute(mesh, [Replicate()]).to_local()
        model = parallelize_module(net().to(dev), mesh,
                                   {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x, _ = batch(0)
        dist.broadcast(x, src=0)  # tensor parallelism: every rank sees the same batch
        out = model(x)
        out.sum().backward()
        return [round(float((gathered.cpu() - full).abs().max()), 6),
                [round(v, 4) for v in out.flatten().tolist()],
                round(model[0].weight.grad.to_local().sum().item(), 4)]

    def hf_llama_tensor_parallel():
        """transformers' tensor parallelism picks the accelerator (tpu) whatever the group's
        backend: over gloo it must still give the single-process CPU logits."""
        from transformers import LlamaConfig, LlamaForCausalLM

        path = os.path.join(os.environ["TPU_DIST_TEST_OUT"], "tiny_llama")
        if rank == 0:
            torch.manual_seed(0)
            LlamaForCausalLM(LlamaConfig(
                vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64)).save_pretrained(path)
        dist.barrier()
        ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
        model = LlamaForCausalLM.from_pretrained(path, tp_plan="auto")
        logits = model(ids.to(model.device)).logits.cpu()
        want = LlamaForCausalLM.from_pretrained(path, device_map="cpu")(ids).logits
        return [model.device.type, bool((logits - want).abs().max() < 1e-5)]

    return {"ddp": ddp, "fsdp2": fsdp2, "dtensor_tensor_parallel": dtensor_tensor_parallel,
            "hf_llama_tensor_parallel": hf_llama_tensor_parallel}


def _worker(dev):
    import torch
    import torch.distributed as dist

    signal.alarm(JOB_TIMEOUT_S - 20)  # a hung collective ends this process, not the run
    t0 = time.perf_counter()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    results, seconds = {}, {}
    for family in (_collectives, _functional, _models):
        for name, fn in family(dev, rank, world).items():
            t = time.perf_counter()
            try:
                results[name] = fn()
            except Exception as e:  # noqa: BLE001  (reported, compared with the CPU run)
                results[name] = {"error": f"{type(e).__name__}: {e}"[:600],
                                 "trace": traceback.format_exc()[-1500:]}
            seconds[name] = round(time.perf_counter() - t, 3)
            results["_seconds"] = seconds
            report(results)  # so far: a rank that hangs later still shows what failed
    dist.barrier()
    results["_total_s"] = round(time.perf_counter() - t0, 1)
    report(results)
    dist.destroy_process_group()
    del torch


# ---------------------------------------------------------------- the tests
# The tpu job runs in Strict and in DeferAndFuse (staging reads pending values and records
# its copies back); the CPU job is the reference for both.
MODES = {"strict": {}, "defer": {"TORCH_TPU_DEFER_AND_FUSE": "1"}}
_JOBS: dict = {}


def _job(dev, mode="strict"):
    if (dev, mode) not in _JOBS:
        _JOBS[dev, mode] = launch(__file__, dev, WORLD, timeout=JOB_TIMEOUT_S, env=MODES[mode])
    return _JOBS[dev, mode]


def _check_names():
    names = []
    for family in (_collectives, _functional, _models):
        names += list(family("cpu", 0, WORLD))
    return names


def test_the_c10d_schemas_are_torch_2_13s():
    """The staging kernels replace torch's own PrivateUse1 kernels of the c10d ops, written
    against torch 2.13.0's schemas: a torch that changes one must fail here."""
    import torch

    from torch_tpu.distributed import _staged

    changed = {name: str(getattr(torch.ops.c10d, name).default._schema)
               for name, (_, schema) in _staged.SCHEMAS.items()
               if str(getattr(torch.ops.c10d, name).default._schema) != schema}
    assert not changed and not _staged.SCHEMA_CHANGED, (
        f"torch {torch.__version__} changed c10d op schemas that torch_tpu/distributed/"
        f"_staged.py relies on: {changed}")
    # every c10d op torch gives a PrivateUse1 kernel is staged here
    ops = [n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
           if n.startswith("c10d::")]
    with_kernel = {n for n in ops if torch._C._dispatch_has_kernel_for_dispatch_key(
        f"c10d::{n}", "PrivateUse1")}
    assert with_kernel == set(_staged.SCHEMAS), with_kernel ^ set(_staged.SCHEMAS)


@pytest.mark.parametrize("dev,mode", [("cpu", "strict"), ("tpu", "strict"), ("tpu", "defer")])
def test_job_ran(dev, mode):
    job = _job(dev, mode)
    assert all(c == 0 for c in job.codes), job.log()
    assert all(r is not None for r in job.results), job.log()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", _check_names())
def test_tpu_over_gloo_matches_cpu(name, mode):
    cpu, tpu = _job("cpu"), _job("tpu", mode)
    for job in (cpu, tpu):
        if any(r is None for r in job.results):
            pytest.fail("a job did not finish:\n" + job.log())
    for rank in range(WORLD):
        want, got = cpu.results[rank][name], tpu.results[rank][name]
        assert not (isinstance(want, dict) and "error" in want), (
            f"rank {rank}: {name} fails on CPU itself: {want}")
        assert not (isinstance(got, dict) and "error" in got), f"rank {rank}: {name}: {got}"
        want = _device_to(want, "cpu", "tpu")
        assert got == want, f"rank {rank}: {name}: tpu {got} != cpu {want}"


def _device_to(v, a, b):
    """A CPU run's result as the tpu run reports it (the results name their device)."""
    if v == a:
        return b
    if isinstance(v, list):
        return [_device_to(x, a, b) for x in v]
    return v


if __name__ == "__main__" and "--worker" in sys.argv:
    sys.path.insert(0, HERE)
    _worker(sys.argv[sys.argv.index("--worker") + 1])
