"""tpu_dist: every collective and reduce op in float32, bfloat16 and int64, sub-groups,
async ops, functional collectives, with 2 and 4 processes on 127.0.0.1.

Each job runs in real processes: this file is also the worker
(`python tests/test_distributed.py --worker SCENARIO`). One job per process count runs
every check and reports each one, so a failure names the collective, op and dtype while
the JAX start-up (~3 s a process) is paid once. `launch()` is shared with the other
test_distributed_* files.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


# ---------------------------------------------------------------- launching jobs
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, codes, outputs, results, seconds):
        self.codes, self.outputs, self.results, self.seconds = codes, outputs, results, seconds

    def log(self, rank=None) -> str:
        ranks = range(len(self.outputs)) if rank is None else [rank]
        return "\n".join(f"----- rank {r} (exit {self.codes[r]})\n{self.outputs[r][-6000:]}"
                         for r in ranks)


def launch(script: str, scenario: str, nproc: int, timeout: float = 240,
           env: dict | None = None, args=(), kill_when=None, worker_flag: bool = True) -> Job:
    """Run `script --worker scenario ARGS` (or `script ARGS`) as ranks 0..nproc-1 of one job
    (env:// rendezvous on 127.0.0.1, as torchrun sets it up), wait at most `timeout` s,
    and collect each rank's exit code, output and results (the JSON a worker writes with
    `report()`). `kill_when=(rank, predicate)` SIGKILLs that rank once `predicate()` is
    true; `Job.killed_at` is then the time of the kill."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tpu_dist_test_")
    procs, logs = [], []
    t0 = time.monotonic()
    for rank in range(nproc):
        e = dict(os.environ)
        e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                 LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TPU_DIST_TEST_OUT=tmp, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
                 TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
                 PYTHONPATH=SRC + os.pathsep + e.get("PYTHONPATH", ""))
        e.update(env or {})
        log = open(os.path.join(tmp, f"log{rank}.txt"), "w+")
        cmd = [sys.executable, script] + (["--worker", scenario] if worker_flag else []) + list(args)
        procs.append(subprocess.Popen(cmd,
                                      env=e, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        logs.append(log)
    deadline = t0 + timeout
    killed_at = None
    exited = [None] * nproc
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        now = time.monotonic()
        for i, p in enumerate(procs):
            if exited[i] is None and p.poll() is not None:
                exited[i] = now
        if kill_when and killed_at is None and kill_when[1]():
            _kill(procs[kill_when[0]])
            killed_at = time.monotonic()
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            _kill(p)
    codes = [p.wait() for p in procs]
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    results = []
    for rank in range(nproc):
        path = os.path.join(tmp, f"result{rank}.json")
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    job = Job(codes, outputs, results, time.monotonic() - t0)
    now = time.monotonic()
    job.exited_at = [e if e is not None else now for e in exited]
    job.started_at = t0
    job.killed_at = killed_at
    job.tmp = tmp
    return job


def _kill(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the worker and nothing else
    except ProcessLookupError:
        pass


def report(results: dict) -> None:
    """Worker side: write this rank's results for the launcher."""
    rank = int(os.environ["RANK"])
    with open(os.path.join(os.environ["TPU_DIST_TEST_OUT"], f"result{rank}.json"), "w") as f:
        json.dump(results, f)


# ---------------------------------------------------------------- the collectives job
DTYPES = ["float32", "bfloat16", "int64"]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]


FULL = os.environ.get("TORCH_TPU_DIST_TESTS", "") == "full"
# 4 processes on 2 cores compile every program 4 times: by default the 4-process job runs
# the float32 checks only (TORCH_TPU_DIST_TESTS=full: every dtype).
DTYPES_4 = DTYPES if FULL else ["float32"]


def _check_names(world: int) -> list:
    names = []
    for dt in (DTYPES if world == 2 else DTYPES_4):
        names += [f"all_reduce[{op}-{dt}]" for op in OPS]
        names += [f"{c}[{dt}]" for c in (
            "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
            "all_to_all", "all_to_all_single", "all_to_all_single_uneven", "gather", "scatter",
            "send_recv", "batch_isend_irecv", "async_all_reduce", "async_all_gather",
            "subgroup_all_reduce", "subgroup_all_gather", "functional")]
        names += [f"reduce_scatter_tensor[{op}-{dt}]" for op in ("SUM", "AVG", "MIN")]
        names += [f"reduce[{op}-{dt}]" for op in ("SUM", "MAX")]
    if world == 2 or "int64" in DTYPES_4:
        names += [f"all_reduce[{op}-int64]" for op in ("BAND", "BOR", "BXOR")]
    names += ["all_reduce[view]", "all_reduce[bool-MAX]", "cpu_tensor", "objects", "barrier",
              "all_to_all_uneven_list", "dtensor_redistribute", "groups_and_p2p_interleaved",
              "recv_wrong_size"]
    return names


def _job(world: int):
    key = f"_job{world}"
    if key not in _JOBS:
        env = {} if world == 2 else {"TPU_DIST_CHECK_DTYPES": ",".join(DTYPES_4)}
        _JOBS[key] = launch(__file__, "collectives", world, timeout=400, env=env)
    return _JOBS[key]


_JOBS: dict = {}


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_job_ran(world):
    job = _job(world)
    assert all(c == 0 for c in job.codes), job.log()
    assert all(r is not None for r in job.results), job.log()


@pytest.mark.parametrize("world,name", [(w, n) for w in (2, 4) for n in _check_names(w)])
def test_collective(world, name):
    job = _job(world)
    if any(r is None for r in job.results):
        pytest.fail("the job did not finish:\n" + job.log())
    for rank, res in enumerate(job.results):
        assert name in res, f"rank {rank} did not run {name}"
        assert res[name] == "ok", f"rank {rank}: {name}: {res[name]}"


# ---------------------------------------------------------------- worker side
def _worker_collectives():
    import torch
    import torch.distributed as dist

    import torch_tpu.distributed  # noqa: F401  (registers tpu_dist until torch_tpu does)

    t0 = time.perf_counter()
    dist.init_process_group("tpu_dist")
    t1 = time.perf_counter()
    from test_distributed_checks import run_checks  # noqa: E402

    results = run_checks(dist.get_rank(), dist.get_world_size())
    dist.barrier()
    results["_seconds"]["init_process_group"] = round(t1 - t0, 3)
    results["_seconds"]["start"] = round(t0 - _T_START, 3)
    report(results)
    dist.destroy_process_group()
    del torch


_T_START = time.perf_counter()
if __name__ == "__main__" and "--worker" in sys.argv:
    sys.path.insert(0, HERE)
    scenario = sys.argv[sys.argv.index("--worker") + 1]
    {"collectives": _worker_collectives}[scenario]()
