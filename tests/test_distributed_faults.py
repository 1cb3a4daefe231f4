"""tpu_dist faults: a dead rank, a hung rank, mismatched shapes, a rank that never joins;
and the mp.spawn launcher. Every job is bounded (loops and launcher timeouts), on
127.0.0.1.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import pytest

from helpers.dist_launch import FULL, HERE, SRC, free_port, launch, report

pytestmark = pytest.mark.distributed  # every test here runs a multi-process job


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))


def _worker_train():
    """DDP training for at most 2000 steps; rank 0 checkpoints after every step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_tpu.distributed  # noqa: F401

    ckpt = sys.argv[sys.argv.index("--ckpt") + 1]
    dist.init_process_group("tpu_dist")
    rank = dist.get_rank()
    model = DDP(_mlp().to("tpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(2000):
        x = torch.randn(8, 16, generator=g).to("tpu")
        loss = (model(x) - x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0:
            state = {k: v.cpu() for k, v in model.module.state_dict().items()}
            torch.save({"step": step, "model": state}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
            with open(ckpt + ".step", "w") as f:
                f.write(str(step))
        time.sleep(0.02)


def test_dead_rank_others_exit_fast_and_checkpoint_loads(tmp_path):
    """Kill rank 1 of a DDP job mid-training: the survivor stops with a clear error within
    seconds (not at its timeout), and the checkpoint rank 0 wrote before the kill loads."""
    import torch

    ckpt = str(tmp_path / "ckpt.pt")

    def trained_a_few_steps():  # the kill lands mid-training, after a few checkpoints
        try:
            with open(ckpt + ".step") as f:
                return int(f.read() or -1) >= 5
        except (OSError, ValueError):
            return False

    job = launch(__file__, "train", 2, timeout=240, args=("--ckpt", ckpt),
                 kill_when=(1, trained_a_few_steps))
    assert job.killed_at is not None, "training never got going:\n" + job.log()
    assert job.codes[0] != 0, "the survivor finished as if nothing happened:\n" + job.log(0)
    took = job.exited_at[0] - job.killed_at
    assert took < 30, f"the survivor took {took:.1f} s to stop:\n" + job.log(0)
    out = job.outputs[0]
    assert "tpu_dist" in out and ("died" in out or "closed its connection" in out), job.log(0)

    state = torch.load(ckpt, map_location="cpu")
    assert state["step"] >= 5, state["step"]
    model = _mlp()
    model.load_state_dict(state["model"])
    assert not torch.equal(model[0].weight, _mlp()[0].weight), "checkpoint holds the initial weights"


def _worker_mismatch():
    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist")
    rank = dist.get_rank()
    t = torch.ones(4 if rank == 0 else 8, device="tpu")
    dist.all_reduce(t)
    t.sum().item()  # the watchdog ends the process before (or while) this waits
    time.sleep(20)


def test_mismatched_shapes_clear_error():
    job = launch(__file__, "mismatch", 2, timeout=120)
    for rank in range(2):
        out = job.outputs[rank]
        assert job.codes[rank] != 0, job.log(rank)
        assert "mismatched collective" in out, job.log(rank)
        assert "rank 0: all_reduce" in out and "4 element(s) in" in out, job.log(rank)
        assert "rank 1: all_reduce" in out and "8 element(s) in" in out, job.log(rank)
    assert max(job.exited_at) - min(job.exited_at) < 15, job.log()


def _worker_mismatch_raise():
    """With async error handling off, the mismatch surfaces as an exception at a wait."""
    import torch
    import torch.distributed as dist

    import torch_tpu.distributed as td

    dist.init_process_group("tpu_dist")
    rank = dist.get_rank()
    t = torch.ones(4 if rank == 0 else 8, device="tpu")
    dist.all_reduce(t)
    try:
        dist.barrier()
        report({"raised": None})
    except td.CollectiveMismatch as e:
        report({"raised": str(e)})


@pytest.mark.skipif(not FULL, reason="TORCH_TPU_DIST_TESTS=full")
def test_mismatch_raises_at_barrier_when_not_aborting():
    job = launch(__file__, "mismatch_raise", 2, timeout=120,
                 env={"TORCH_TPU_DIST_ASYNC_ERROR_HANDLING": "0"})
    for rank in range(2):
        assert job.results[rank] is not None, job.log(rank)
        msg = job.results[rank]["raised"]
        assert msg and "mismatched collective" in msg and "8 element(s)" in msg, job.log(rank)


def _worker_hang():
    import datetime

    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=8))
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    t.sum().item()
    if rank == 1:
        time.sleep(60)  # alive, heartbeating, but never joins the next collective
    dist.all_reduce(t)
    t.sum().item()


def test_hung_rank_timeout_is_honoured():
    job = launch(__file__, "hang", 2, timeout=120)
    out = job.outputs[0]
    assert job.codes[0] != 0, job.log(0)
    assert "did not complete within the timeout of 8 s" in out, job.log(0)
    # rank 0 stops about 8 s after it issued the collective, long before rank 1 wakes
    assert job.exited_at[0] - job.started_at < 50, job.log()
    assert job.codes[1] != 0 and job.exited_at[1] - job.started_at < 75, job.log(1)


def _worker_alone():
    import datetime

    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    t0 = time.monotonic()
    try:
        dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=6))
        report({"raised": None})
    except Exception as e:  # noqa: BLE001
        report({"raised": f"{type(e).__name__}: {e}"[:500], "seconds": time.monotonic() - t0})


def test_init_timeout_when_a_rank_never_joins():
    """WORLD_SIZE=2 but only rank 0 starts: init_process_group gives up after its timeout."""
    job = launch(__file__, "alone", 1, timeout=90, env={"WORLD_SIZE": "2"})
    res = job.results[0]
    assert res is not None and res["raised"], job.log()
    assert res["seconds"] < 30, res


def _spawned(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist", rank=rank, world_size=world)
    t = torch.full((3,), float(rank + 1), device="tpu")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [float(sum(range(1, world + 1)))] * 3, t
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to("tpu"))
    model(torch.ones(2, 4, device="tpu")).sum().backward()
    g = model.module.weight.grad.cpu()
    dist.destroy_process_group()
    if rank == 0:
        os.environ["RANK"] = "0"
        report({"sum": t.cpu().tolist(), "grad": g.tolist()})


def _worker_spawn():
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(2, free_port()), nprocs=2, join=True)


def test_mp_spawn_launch():
    job = launch(__file__, "spawn", 1, timeout=200)
    assert job.codes[0] == 0, job.log()
    assert job.results[0] == {"sum": [3.0, 3.0, 3.0], "grad": [[2.0] * 4, [2.0] * 4]}, job.results


def _worker_early():
    """Under torchrun: the tpu device is used before init_process_group. As the backend
    starts, `_runtime` calls tpu_dist's `before_backend()`, which joins JAX's runtime
    through the agent's store."""
    import torch
    import torch.distributed as dist

    x = torch.ones(3, device="tpu") * (int(os.environ["RANK"]) + 1)
    dist.init_process_group("tpu_dist")
    dist.all_reduce(x)
    report({"sum": x.cpu().tolist()})


def test_torchrun_device_used_before_init():
    import subprocess

    out_dir = tempfile.mkdtemp(prefix="tpu_dist_early_")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
               TPU_DIST_TEST_OUT=out_dir, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", __file__,
           "--worker", "early"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    for rank in range(2):
        with open(os.path.join(out_dir, f"result{rank}.json")) as f:
            assert json.load(f) == {"sum": [3.0, 3.0, 3.0]}


if __name__ == "__main__" and "--worker" in sys.argv:
    sys.path.insert(0, HERE)
    scenario = sys.argv[sys.argv.index("--worker") + 1]
    {"train": _worker_train, "mismatch": _worker_mismatch, "mismatch_raise": _worker_mismatch_raise,
     "hang": _worker_hang, "alone": _worker_alone, "spawn": _worker_spawn,
     "early": _worker_early}[scenario]()
