"""tpu_dist faults: a killed rank (rank 0, the JAX coordinator, included), a rank that
raises, a hung rank, mismatched shapes, a rank that never joins; and the mp.spawn and
torchrun launchers. Each failure must end the other ranks within seconds with one
message naming the rank at fault, and never hand a failed or refused collective's data
to the script. Every job is bounded (loops and launcher timeouts), on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import pytest

from helpers.dist_launch import FULL, HERE, SRC, USER_CODE, free_port, launch, report



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
    """Kill rank 1 of a DDP job mid-training: the survivor stops within seconds (not at
    its timeout) with one message naming rank 1, and the checkpoint rank 0 wrote before
    the kill loads. (The 4-process torchrun version, for rank 0 too: test_kill_*.)"""
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
    assert took < 10, f"the survivor took {took:.1f} s to stop:\n" + job.log(0)
    _assert_names_dead_rank(job.outputs[0], 1)

    state = torch.load(ckpt, map_location="cpu")
    assert state["step"] >= 5, state["step"]
    model = _mlp()
    model.load_state_dict(state["model"])
    assert not torch.equal(model[0].weight, _mlp()[0].weight), "checkpoint holds the initial weights"


def _assert_names_dead_rank(out: str, victim: int) -> None:
    """One tpu_dist message naming the killed rank, and none of JAX's raw errors."""
    assert out.count(f"tpu_dist: rank {victim} died") == 1, out[-6000:]
    for raw in ("JaxRuntimeError", "Error dispatching computation", "detected fatal errors",
                "127.0.0.1]:"):
        assert raw not in out, f"{raw!r} in the output:\n{out[-6000:]}"


# ---------------------------------------------------------------- the kill test
# tests/user_code/ddp_checkpoint_kill.py, a CUDA DDP script with "cuda" -> "tpu" and "nccl" ->
# "tpu_dist", on 4 processes, each under its own torchrun agent (as on 4 hosts, where no
# agent stops the others): one rank is SIGKILLed mid-training or inside a loop of
# collectives. Every survivor must stop within 10 s of the kill with one message naming
# the killed rank, and the last checkpoint must hold exactly the values of another run's
# checkpoint at the same step (the collectives-phase runs train to the end and keep every
# checkpoint: they are each other's and the training kills' reference).
# The victim is killed once it has written step KILL_AT_STEP: the steps after it must
# outlast the test's poll (50 ms) and the kill, so that it lands mid-training. 12 steps
# were too few once warm steps got fast (the job reached step 12 first, in a full run).
KILL_STEPS = 36  # (a multiple of the script's CKPT_EVERY: its last step is checkpointed)
KILL_AT_STEP = 7
_KILLS: dict = {}


def _kill_job(victim: int, phase: str):
    key = (victim, phase)
    if key in _KILLS:
        return _KILLS[key]
    from helpers.dist_launch import swap_cuda

    work = tempfile.mkdtemp(prefix=f"tpu_dist_kill{victim}{phase}_")
    script = swap_cuda(os.path.join(USER_CODE, "ddp_checkpoint_kill.py"),
                       os.path.join(work, "ddp_checkpoint_kill.py"))
    ckpt = os.path.join(work, "ckpt")
    os.mkdir(ckpt)
    seen = []

    def ready():
        try:
            with open(os.path.join(ckpt, f"progress{victim}")) as f:
                text = f.read()
        except OSError:
            return False
        if phase == "train":
            return text.startswith("train") and int(text.split()[1]) >= KILL_AT_STEP
        if text == "collectives":  # well inside the loop: it issues ~100 collectives a second
            seen.append(time.monotonic())
            return seen[-1] - seen[0] > 0.5
        return False

    job = launch(script, "", 4, timeout=400, worker_flag=False, torchrun=True,
                 kill_when=(victim, ready),
                 env={"CKPT_DIR": ckpt, "KEEP_ALL": "1", "STEPS": str(KILL_STEPS)})
    job.ckpt = ckpt
    survivors = [r for r in range(4) if r != victim and job.killed_at is not None]
    job.exit_s = {r: round(job.worker_exited_at.get(r, job.exited_at[r]) - job.killed_at, 2)
                  for r in survivors}
    agents_s = {r: round(job.exited_at[r] - job.killed_at, 2) for r in survivors}
    print(f"\nkill rank {victim} during {phase}: the survivors' workers stopped after "
          f"{job.exit_s} s, their torchrun agents after {agents_s} s (job {job.seconds:.0f} s)")
    _KILLS[key] = job
    return job


def _same_bits(a, b, where=""):
    import torch

    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same_bits(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_bits(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), where
    else:
        assert a == b, where


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["collectives", "train"])
@pytest.mark.parametrize("victim", [0, 2])
def test_kill_a_rank_survivors_name_it_and_checkpoint_loads(victim, phase):
    import torch

    job = _kill_job(victim, phase)
    assert job.killed_at is not None, "the job never reached the kill point:\n" + job.log()
    for rank in range(4):
        if rank == victim:
            continue
        assert job.codes[rank] != 0, job.log(rank)
        assert job.exit_s[rank] < 10, (job.exit_s, job.log(rank))
        _assert_names_dead_rank(job.outputs[rank], victim)
        if victim == 0:  # the coordinator's death: tpu_dist's message, not JAX's FATAL
            assert "JAX's coordination service" in job.outputs[rank], job.log(rank)

    state = torch.load(os.path.join(job.ckpt, "last.pt"), map_location="cpu")
    step = state["step"]
    if phase == "train":
        assert 3 <= step < KILL_STEPS, step  # the kill came mid-training
    else:
        assert step == KILL_STEPS, step
    ref_job = _kill_job(2 if victim == 0 else 0, "collectives")
    ref = torch.load(os.path.join(ref_job.ckpt, f"step{step}.pt"), map_location="cpu")
    _same_bits(state, ref, "checkpoint")
    from torch import nn

    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    model.load_state_dict(state["model"])  # a CPU model takes it as it is


def _worker_mismatch():
    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist")
    rank = dist.get_rank()
    t = torch.ones(4 if rank == 0 else 8, device="tpu")
    dist.all_reduce(t)
    # the refused all_reduce's output is zeros on the device: the read must end the
    # process (or raise), never hand them out
    print(f"READ {t.sum().item()}", flush=True)
    time.sleep(20)


def test_mismatched_shapes_clear_error():
    job = launch(__file__, "mismatch", 2, timeout=120)
    for rank in range(2):
        out = job.outputs[rank]
        assert job.codes[rank] != 0, job.log(rank)
        assert "READ" not in out, "a refused collective's result reached the script:\n" + out
        assert out.count("mismatched collective") == 1, job.log(rank)  # once, not repeated
        assert "rank 0: all_reduce" in out and "4 element(s) in" in out, job.log(rank)
        assert "rank 1: all_reduce" in out and "8 element(s) in" in out, job.log(rank)
        assert "Traceback" not in out and "JaxRuntimeError" not in out, job.log(rank)
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
    out = {}
    try:  # the refused all_reduce's result: its zeros must not be handed out
        out["read"] = t.cpu().tolist()
    except td.CollectiveMismatch as e:
        out["read_raised"] = str(e)
    try:
        dist.barrier()
        out["raised"] = None
    except td.CollectiveMismatch as e:
        out["raised"] = str(e)
    try:  # nothing is issued after a failure
        dist.all_reduce(torch.ones(2, device="tpu"))
        out["next"] = None
    except dist.DistBackendError as e:
        out["next"] = str(e)
    report(out)


@pytest.mark.skipif(not FULL, reason="TORCH_TPU_DIST_TESTS=full")
def test_mismatch_raises_at_barrier_when_not_aborting():
    job = launch(__file__, "mismatch_raise", 2, timeout=120,
                 env={"TORCH_TPU_DIST_ASYNC_ERROR_HANDLING": "0"})
    for rank in range(2):
        res = job.results[rank]
        assert res is not None, job.log(rank)
        assert "read" not in res, res  # the zeros of the refused collective
        for key in ("read_raised", "raised", "next"):
            msg = res[key]
            assert msg and "mismatched collective" in msg and "8 element(s)" in msg, (key, res)


def _worker_dead_peer_raise():
    """With async error handling off, a dead peer's collectives raise, naming it."""
    import signal

    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist")
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    t.sum().item()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    out = {"reads": []}
    for _ in range(200):
        try:
            t.fill_(1.0)
            dist.all_reduce(t)
            out["reads"].append(t.sum().item())
        except dist.DistBackendError as e:
            out["raised"] = str(e)
            break
        time.sleep(0.02)
    try:
        dist.all_reduce(t)
        out["next"] = None
    except dist.DistBackendError as e:
        out["next"] = str(e)
    report(out)


def test_dead_peer_raises_when_not_aborting():
    job = launch(__file__, "dead_peer_raise", 2, timeout=120,
                 env={"TORCH_TPU_DIST_ASYNC_ERROR_HANDLING": "0"})
    res = job.results[0]
    assert res is not None, job.log()
    assert all(v == 8.0 for v in res["reads"]), res  # only values all ranks contributed to
    for key in ("raised", "next"):
        assert "tpu_dist: rank 1 died" in res[key], (key, res)
    assert job.codes[0] == 1, job.log(0)  # and it left without JAX's shutdown barrier
    assert job.exited_at[0] - job.started_at < 90, job.log(0)


def _worker_crash():
    """Rank 1 raises; rank 0 goes on issuing collectives (at most 20 s of them)."""
    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    dist.init_process_group("tpu_dist")
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    t.sum().item()
    if dist.get_rank() == 1:
        raise ValueError("boom in the data loader")
    for _ in range(1000):
        dist.all_reduce(t)
        time.sleep(0.02)
    t.sum().item()


def test_rank_that_raises_is_named_by_the_others():
    job = launch(__file__, "crash", 2, timeout=120)
    out = job.outputs[0]
    assert job.codes[0] != 0, job.log(0)
    assert "rank 1 stopped on an error: uncaught ValueError: boom in the data loader" in out, \
        job.log()
    assert job.exited_at[0] - job.exited_at[1] < 5, job.log()


def _worker_hang():
    import datetime

    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401

    import os
    import warnings

    eight = datetime.timedelta(seconds=8)
    if os.environ.get("SET_BY") == "set_pg_timeout":  # torchtitan's way, after its first step
        dist.init_process_group("tpu_dist")
    else:
        dist.init_process_group("tpu_dist", timeout=eight)
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    t.sum().item()
    if os.environ.get("SET_BY") == "set_pg_timeout":
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "only supported for nccl or gloo"
            dist.distributed_c10d._set_pg_timeout(eight)
    if rank == 1:
        time.sleep(60)  # alive, heartbeating, but never joins the next collective
    dist.all_reduce(t)
    t.sum().item()


@pytest.mark.parametrize("set_by", ["init", "set_pg_timeout"])
def test_hung_rank_timeout_is_honoured(set_by):
    job = launch(__file__, "hang", 2, timeout=120, env={"SET_BY": set_by})
    out = job.outputs[0]
    assert job.codes[0] != 0, job.log(0)
    assert "did not complete within the timeout of 8 s" in out, job.log(0)
    assert "rank 1 has issued only 1 collective(s) on this group" in out, job.log(0)
    # rank 0 stops about 8 s after it issued the collective, long before rank 1 wakes;
    # rank 1 hears of it over the links and stops at once
    assert job.exited_at[0] - job.started_at < 50, job.log()
    assert job.codes[1] != 0 and job.exited_at[1] - job.exited_at[0] < 5, job.log(1)
    assert "rank 0 stopped on an error" in job.outputs[1], job.log(1)


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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE, os.environ.get("PYTHONPATH", "")]),
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
     "dead_peer_raise": _worker_dead_peer_raise, "crash": _worker_crash, "hang": _worker_hang,
     "alone": _worker_alone, "spawn": _worker_spawn, "early": _worker_early}[scenario]()
