"""Process-per-chip binding with several devices visible to each process: the GPU host's
layout (every process sees every device), simulated by XLA:CPU with
--xla_force_host_platform_device_count. A CUDA-style torchrun script
(tests/user_code/parallel_cuda_style.py, "cuda" -> "tpu") trains DDP, FSDP2 and TP; each
rank must compute on its own local device (the JAX device behind its tensors), with the
single-process CPU result, and `python -m torch_tpu info` must show the binding."""
import os
import pathlib
import subprocess
import sys

import pytest

from helpers.dist_launch import SRC, run_script, swap_cuda

pytestmark = pytest.mark.distributed
SCRIPTS = pathlib.Path(__file__).parents[1] / "user_code"


@pytest.mark.parametrize("nproc,visible", [(2, 2), (2, 4), (4, 4), (4, 2)])
def test_each_rank_on_its_own_local_device(tmp_path, nproc, visible):
    script = swap_cuda(SCRIPTS / "parallel_cuda_style.py", tmp_path / "parallel.py")
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={visible}", "CHECK_BUFFERS": "1"}
    code, out, results = run_script(script, env, nproc, timeout=600)
    assert code == 0 and len(results) == nproc, out[-8000:]
    for r in results:
        rank = r["rank"]
        own = rank % visible  # its local rank's device, shared round-robin past `visible`
        assert len(r["local_devices"]) == visible, r
        assert r["runtime_device"] == r["device_id"] == r["local_devices"][own]
        assert r["buffer_devices"] == [r["local_devices"][own]]
        assert (r["current"], r["count"]) == (rank, nproc)
        for name, s in r["strategies"].items():
            assert s["device"] == f"tpu:{rank}", (name, s)
            assert s["max_param_diff"] <= 1e-5, (name, s)
            assert max(abs(a - b) for a, b in zip(s["losses"], r["ref_losses"])) <= 1e-5, (name, s)


def test_info_shows_the_binding():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "2", "WORLD_SIZE": "4",
           "PYTHONPATH": SRC}
    env.pop("TORCH_TPU_PLATFORM", None)
    out = subprocess.run([sys.executable, "-m", "torch_tpu", "info"], env=env, text=True,
                         capture_output=True, timeout=120, check=True).stdout
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    assert lines["binding"].strip() == "cpu, local rank 2 of 4 on host 0 of 1 (torchrun)"
    assert lines["NPROC"].strip().endswith("(set here)")
    assert lines["this process's device"].strip().startswith("TFRT_CPU_2") or \
        "id 2" in lines["this process's device"]
    assert lines["torch device"].strip() == "tpu:2 (device_count=4)"


def test_2d_mesh_with_several_devices_visible():
    """FSDP2 over dp x TP (examples/dp_tp_2d.py, 4 processes) with two devices visible to
    each process: the meshes are built from the devices the processes drive."""
    from helpers.dist_launch import EXAMPLES, launch

    env = {"PYTHONPATH": os.pathsep.join([EXAMPLES, SRC, os.environ.get("PYTHONPATH", "")]),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    job = launch(os.path.join(EXAMPLES, "dp_tp_2d.py"), "", 4, timeout=480, env=env,
                 args=("--model", "llama", "--check", "--steps", "2"), worker_flag=False)
    assert all(c == 0 for c in job.codes), job.log()
    for rank in range(4):
        assert "-> MATCH" in job.outputs[rank], job.log(rank)


SPAWN = """
import os, sys, json
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("tpu_dist", rank=rank, world_size=world)
    x = torch.full((4,), float(rank + 1), device="tpu")
    dist.all_reduce(x)
    from torch_tpu import _runtime
    import jax
    print("RESULT " + json.dumps({"rank": rank, "sum": x.tolist(),
          "ordinal": jax.local_devices().index(_runtime.device())}), flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, int(sys.argv[1])), nprocs=2)
"""


def test_mp_spawn_binds_rank_to_its_local_device(tmp_path):
    """torch.multiprocessing.spawn sets no launcher variables: init_process_group's rank
    binds the process (one host), rank r on local device r."""
    from helpers.dist_launch import free_port

    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, str(script), str(free_port())], env=env, text=True,
                         capture_output=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    import json
    import re
    # (the spawned ranks share one stdout: their lines may run together)
    got = sorted((json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", out.stdout)),
                 key=lambda r: r["rank"])
    assert [(r["rank"], r["ordinal"], r["sum"]) for r in got] == [(0, 0, [3.0] * 4), (1, 1, [3.0] * 4)]
