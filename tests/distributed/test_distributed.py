"""tpu_dist: every collective and reduce op in float32, bfloat16 and int64, sub-groups,
async ops, functional collectives, with 2 and 4 processes on 127.0.0.1.

Each job runs in real processes: this file is also the worker
(`python tests/distributed/test_distributed.py --worker SCENARIO`). One job per process count runs
every check and reports each one, so a failure names the collective, op and dtype while
the JAX start-up (~3 s a process) is paid once. The launcher is helpers/dist_launch.py,
the checks helpers/dist_checks.py.
"""
from __future__ import annotations

import sys
import time

import pytest

from helpers.dist_launch import FULL, HERE, launch, report



# ---------------------------------------------------------------- the collectives job
DTYPES = ["float32", "bfloat16", "int64"]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]

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
        if dt != "int64":
            names += [f"{c}[PREMUL_SUM-{f}-{dt}]" for c in ("all_reduce", "reduce_scatter_tensor",
                                                            "reduce") for f in ("number", "tensor")]
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
    from helpers.dist_checks import run_checks

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
