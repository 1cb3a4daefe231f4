"""XLA:CPU's intra-op pool per process (_runtime._share_host_cores,
TORCH_TPU_XLA_CPU_THREADS): torchrun's ranks on one host each get their share of its
cores, as each CUDA rank owns its GPU; a process alone keeps every core; the setting and
jaxlib's own NPROC win. The pool's threads are named tf_XLAEigen."""
import os

import pytest
from helpers.dist_launch import run_script

SCRIPT = '''
import json, os
import torch, torch.distributed as dist
torch_dist = "RANK" in os.environ
if torch_dist:
    dist.init_process_group("tpu_dist")
x = torch.ones(256, 256, device="tpu")
if torch_dist:
    dist.all_reduce(x)
(x @ x).sum().item()
pool = sum(open(f"/proc/self/task/{t}/comm").read().strip() == "tf_XLAEigen"
           for t in os.listdir("/proc/self/task"))
print("RESULT " + json.dumps({"rank": dist.get_rank() if torch_dist else 0, "pool": pool}))
if torch_dist:
    dist.destroy_process_group()
'''
CORES = len(os.sched_getaffinity(0))


def _pools(tmp_path, env, nproc=None):
    script = tmp_path / "pool.py"
    script.write_text(SCRIPT)
    code, out, results = run_script(script, env, nproc=nproc, timeout=300)
    assert code == 0 and len(results) == (nproc or 1), out[-4000:]
    return [r["pool"] for r in results]


@pytest.mark.distributed
def test_torchrun_ranks_share_the_cores(tmp_path):
    assert _pools(tmp_path, {}, nproc=2) == [max(1, CORES // 2)] * 2
    assert _pools(tmp_path, {"TORCH_TPU_XLA_CPU_THREADS": "3"}, nproc=2) == [3, 3]


def test_a_process_alone_keeps_every_core(tmp_path):
    assert _pools(tmp_path, {}) == [CORES]
    assert _pools(tmp_path, {"NPROC": "1"}) == [1]
