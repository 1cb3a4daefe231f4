"""Launching multi-process tpu_dist jobs on 127.0.0.1 for the tests: `launch()` runs a
script as every rank of one job (env:// rendezvous, as torchrun sets it up) and collects
each rank's exit code, output and the results its worker wrote with `report()`.
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

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
EXAMPLES = os.path.join(ROOT, "examples")
USER_CODE = os.path.join(HERE, "user_code")  # user scripts the tests run as subprocesses
# TORCH_TPU_DIST_TESTS=full: every dtype, model and process count; by default a subset
# that still exercises each mechanism.
FULL = os.environ.get("TORCH_TPU_DIST_TESTS", "") == "full"


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
           env: dict | None = None, args=(), kill_when=None, worker_flag: bool = True,
           torchrun: bool = False) -> Job:
    """Run `script --worker scenario ARGS` (or `script ARGS`) as ranks 0..nproc-1 of one job
    (env:// rendezvous on 127.0.0.1, as torchrun sets it up), wait at most `timeout` s,
    and collect each rank's exit code, output and results (the JSON a worker writes with
    `report()`). `kill_when=(rank, predicate)` SIGKILLs that rank once `predicate()` is
    true; `Job.killed_at` is then the time of the kill.

    `torchrun=True`: each rank under its own torchrun agent (`--nnodes=nproc
    --nproc-per-node=1 --node-rank=rank`), as on `nproc` hosts: an agent stops only its
    own worker, so a survivor stops by itself. A kill then hits the rank's worker (not its
    agent); `Job.exited_at` are then the agents' exit times, and `Job.worker_exited_at`
    the workers' (known for the workers alive at the kill)."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tpu_dist_test_")
    procs, logs = [], []
    t0 = time.monotonic()
    for rank in range(nproc):
        e = dict(os.environ)
        e.update(TPU_DIST_TEST_OUT=tmp, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
                 TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
                 PYTHONPATH=os.pathsep.join([SRC, HERE, e.get("PYTHONPATH", "")]))
        if torchrun:
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
                e.pop(k, None)
        else:
            e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                     LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
        e.update(env or {})
        log = open(os.path.join(tmp, f"log{rank}.txt"), "w+")
        cmd = [script] + (["--worker", scenario] if worker_flag else []) + list(args)
        if torchrun:
            cmd = ["-m", "torch.distributed.run", f"--nnodes={nproc}", f"--node-rank={rank}",
                   "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
                   "--max-restarts=0", "--monitor-interval=0.1"] + cmd
        procs.append(subprocess.Popen([sys.executable] + cmd,
                                      env=e, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        logs.append(log)
    deadline = t0 + timeout
    killed_at = None
    exited = [None] * nproc
    workers, worker_exited = {}, {}  # torchrun: rank -> worker pid, rank -> exit time
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        now = time.monotonic()
        for i, p in enumerate(procs):
            if exited[i] is None and p.poll() is not None:
                exited[i] = now
        for r, pid in workers.items():
            if r not in worker_exited and not _running(pid):
                worker_exited[r] = now
        if kill_when and killed_at is None and kill_when[1]():
            victim = procs[kill_when[0]]
            if torchrun:
                workers = {r: _worker_of(p.pid) for r, p in enumerate(procs) if p.poll() is None}
                _kill_pid(workers[kill_when[0]])
            else:
                _kill(victim)
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
    job.worker_exited_at = worker_exited
    job.tmp = tmp
    return job


def _kill(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the worker and nothing else
    except ProcessLookupError:
        pass


def _worker_of(agent: int) -> int:
    """The worker process a torchrun agent started (its child)."""
    with open(f"/proc/{agent}/task/{agent}/children") as f:
        children = [int(c) for c in f.read().split()]
    assert len(children) == 1, f"torchrun agent {agent} has children {children}"
    return children[0]


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def report(results: dict) -> None:
    """Worker side: write this rank's results for the launcher."""
    rank = int(os.environ["RANK"])
    with open(os.path.join(os.environ["TPU_DIST_TEST_OUT"], f"result{rank}.json"), "w") as f:
        json.dump(results, f)


def swap_cuda(src, dst) -> str:
    """The literal migration: a script written for CUDA, every `cuda` -> `tpu` and `nccl` ->
    `tpu_dist`, written to `dst`; returns dst."""
    text = open(src).read()
    assert "cuda" in text, f"{src} is not written for CUDA"
    with open(dst, "w") as f:
        f.write(text.replace("cuda", "tpu").replace("nccl", "tpu_dist"))
    return str(dst)


def run_script(script, env=None, nproc=None, timeout=600):
    """Run `script` as a user would: `python script`, or under torchrun with `nproc`
    processes on 127.0.0.1. -> (exit code, output, its `RESULT {json}` lines sorted by
    rank). A job that outlives `timeout` is killed with all its processes."""
    import pytest

    cmd = [sys.executable, str(script)]
    if nproc:
        cmd[1:1] = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                    str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    e = {k: v for k, v in os.environ.items()
         if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=e, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{script} ran past {timeout} s:\n{out[-6000:]}")
    # every `RESULT {json}` anywhere in the output: the ranks share one pipe, and an
    # unbuffered print writes its text and its newline separately, so two ranks' results
    # (or a warning) can share a line
    decode = json.JSONDecoder().raw_decode
    results, at = [], out.find("RESULT {")
    while at >= 0:
        results.append(decode(out, at + 7)[0])
        at = out.find("RESULT {", at + 7)
    return proc.returncode, out, sorted(results, key=lambda r: r["rank"])


def run_single(script, env=None, timeout=600):
    """A one-process script that prints one RESULT line: (that result, the output)."""
    code, out, results = run_script(script, env, timeout=timeout)
    assert code == 0 and len(results) == 1, out[-8000:]
    return results[0], out


def report_counter(out: str, name: str) -> int:
    """A counter from the metrics report TORCH_TPU_METRICS=1 prints at exit."""
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            return int(parts[1])
    return 0
