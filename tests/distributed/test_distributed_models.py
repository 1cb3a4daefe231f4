"""DDP, FSDP2, tensor parallelism and 2-D (DP x TP) training of small HF Llama and Qwen2 on
tpu_dist: the examples under examples/, run as real jobs on 127.0.0.1, must reproduce the
losses of one process training on the whole batch (their --check).

The default run (a few minutes of compiling on 2 cores) covers DDP on Qwen2 under torchrun
itself and the 2-D mesh (FSDP2 over dp x TP) on Llama with 4 processes;
TORCH_TPU_DIST_TESTS=full runs every model x strategy x process count (DDP, FSDP2, TP x
Llama, Qwen2 x 2, 4 processes, and 2-D for both models).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.dist_launch import EXAMPLES, FULL, SRC, free_port, launch



DEFAULT = [("dp_tp_2d", "llama", 4)]
EVERYTHING = [(s, m, n) for s in ("ddp", "fsdp2", "tp") for m in ("llama", "qwen")
              for n in (2, 4)] + [("dp_tp_2d", m, 4) for m in ("llama", "qwen")]
CASES = EVERYTHING if FULL else DEFAULT


def run_example(strategy: str, model: str, nproc: int, *extra, timeout=420):
    script = os.path.join(EXAMPLES, f"{strategy}.py")
    # the examples import `common` from their own directory
    env = {"PYTHONPATH": os.pathsep.join([EXAMPLES, SRC, os.environ.get("PYTHONPATH", "")])}
    return launch(script, "", nproc, timeout=timeout, env=env,
                  args=("--model", model, *extra), worker_flag=False)


@pytest.mark.parametrize("strategy,model,nproc", CASES)
def test_matches_single_process(strategy, model, nproc):
    job = run_example(strategy, model, nproc, "--check", "--steps", "3")
    assert all(c == 0 for c in job.codes), job.log()
    for rank in range(nproc):
        assert "-> MATCH" in job.outputs[rank], job.log(rank)


def test_fsdp2_summed_gradients_as_torchtitan():
    """torchtitan's FSDP2 setting, set_gradient_divide_factor(1.0): FSDP2 reduce-scatters
    the gradients with ReduceOp.PREMUL_SUM, which tpu_dist takes as NCCL does."""
    job = run_example("fsdp2", "llama", 2, "--check", "--steps", "3", "--sum-gradients")
    assert all(c == 0 for c in job.codes), job.log()
    for rank in range(2):
        assert "-> MATCH" in job.outputs[rank], job.log(rank)


@pytest.mark.parametrize("model", ["qwen", "llama"] if FULL else ["qwen"])
def test_torchrun_ddp(model):
    """The DDP example under torchrun itself (its agent, its store, its environment)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLES, SRC, os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--master-addr=127.0.0.1", f"--master-port={port}",
           os.path.join(EXAMPLES, "ddp.py"), "--model", model, "--steps", "3", "--check"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert out.count("-> MATCH") == 2, out[-6000:]
