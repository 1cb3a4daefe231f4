"""The binding decisions (_binding.py) over tables from the public documentation: libtpu's
topology variables per TPU generation for 1, 2 and 4 hosts, the local GPU, the launchers,
and the refusal to fall back to the CPU. No hardware: each decision is a pure function."""
import pytest

from torch_tpu import _binding as B

# (generation, chips on a host, hosts) -> TPU_PROCESS_BOUNDS with one process per chip.
# The slice shapes are Cloud TPU's: v4-8 2x2x1, v4-16 2x2x2, v4-32 2x2x4; v5litepod-4
# 2x2, -8 2x4, -16 4x4 (4-chip hosts); v6e the same as v5e; v5p and TPU7x as v4.
TOPOLOGIES = [
    ("v4", 4, 1, "2,2,1"), ("v4", 4, 2, "2,2,2"), ("v4", 4, 4, "2,2,4"),
    ("v5p", 4, 1, "2,2,1"), ("v5p", 4, 2, "2,2,2"), ("v5p", 4, 4, "2,2,4"),
    ("v5e", 4, 1, "2,2,1"), ("v5e", 8, 1, "2,4,1"), ("v5e", 4, 2, "2,4,1"), ("v5e", 4, 4, "4,4,1"),
    ("v6e", 4, 1, "2,2,1"), ("v6e", 8, 1, "2,4,1"), ("v6e", 4, 2, "2,4,1"), ("v6e", 4, 4, "4,4,1"),
    ("v7x", 4, 1, "2,2,1"), ("v7x", 4, 2, "2,2,2"), ("v7x", 4, 4, "2,2,4"),
]


def _run(local_rank, local_world, host=0, hosts=1):
    return B.Launch(local_rank, local_world, host * local_world + local_rank,
                    hosts * local_world, "torchrun")


@pytest.mark.parametrize("gen,chips,hosts,bounds", TOPOLOGIES)
def test_one_process_per_chip(gen, chips, hosts, bounds):
    names = [f"host{i}" for i in range(hosts)] if hosts > 1 else None
    for host in range(hosts):
        for r in range(chips):
            v = B.tpu_variables(B.generation(gen), chips, _run(r, chips, host, hosts), names)
            assert v["TPU_VISIBLE_CHIPS"] == str(r)
            assert v["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
            assert v["TPU_PROCESS_BOUNDS"] == bounds
            assert v["TPU_PROCESS_PORT"] == str(8476 + r)
            assert v["CLOUD_TPU_TASK_ID"] == str(host * chips + r)
            assert v["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
            addresses = v["TPU_PROCESS_ADDRESSES"].split(",")
            assert len(addresses) == hosts * chips  # every process of the slice, host-major
            assert addresses[host * chips + r] == f"{(names or ['localhost'])[host]}:{8476 + r}"


def test_slice_sizes_match_the_published_shapes():
    assert B.host_grid(B.generation("v4-64"), 8) == (1, 2, 4)      # v4-64: 2x4x4
    assert B.host_grid(B.generation("v4-128"), 16) == (2, 2, 4)    # v4-128: 4x4x4
    assert B.host_grid(B.generation("v5litepod-32"), 8) == (2, 4, 1)   # 4x8
    assert B.host_grid(B.generation("v5litepod-64"), 16) == (4, 4, 1)  # 8x8
    with pytest.raises(B.BindingError, match="3 hosts"):
        B.host_grid(B.generation("v4"), 3)


def test_fewer_processes_than_chips_take_consecutive_blocks():
    v5e = B.generation("v5e")
    got = [B.tpu_variables(v5e, 8, _run(r, 2)) for r in range(2)]
    assert [g["TPU_VISIBLE_CHIPS"] for g in got] == ["0,1,2,3", "4,5,6,7"]
    assert got[0]["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
    assert got[0]["TPU_PROCESS_BOUNDS"] == "1,2,1"
    with pytest.raises(B.BindingError, match="evenly"):
        B.tpu_variables(v5e, 8, _run(0, 3))


def test_generation_names():
    assert B.generation("v5litepod-16").name == "v5e"
    assert B.generation("tpu7x-8").name == "v7x"
    assert B.generation("v6e").name == "v6e"
    with pytest.raises(B.BindingError, match="unknown TPU generation"):
        B.generation("v9z-8")


def test_multi_host_needs_the_addresses():
    with pytest.raises(B.BindingError, match="TPU_WORKER_HOSTNAMES"):
        B.tpu_variables(B.generation("v4"), 4, _run(0, 4, 0, 2))


TPU_HOST = B.Host(tpu_chips=4, tpu_generation="v5e", has_tpu_runtime=True, cores=8)


def test_plan_tpu_under_torchrun():
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "RANK": "3", "WORLD_SIZE": "4"}
    b = B.plan(TPU_HOST, env, run=B.launch(env))
    assert b.platform == "tpu" and b.bound
    assert b.variables["TPU_VISIBLE_CHIPS"] == "3"
    assert b.variables["TPU_PROCESS_BOUNDS"] == "2,2,1"
    assert b.variables["LIBTPU_INIT_ARGS"] == f"{B.LAUNCH_BARRIER}=false"
    assert b.ordinal(1) == 0
    lines = dict(b.describe())
    assert "local rank 3 of 4" in lines["binding"] and lines["TPU_VISIBLE_CHIPS"] == "3 (set here)"


def test_a_users_variable_wins():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "TPU_PROCESS_PORT": "9000",
           "LIBTPU_INIT_ARGS": "--foo"}
    b = B.plan(TPU_HOST, env, run=B.launch(env))
    assert b.kept == {"TPU_PROCESS_PORT": "9000"}
    assert "TPU_PROCESS_PORT" not in b.variables and b.variables["TPU_VISIBLE_CHIPS"] == "1"
    assert b.variables["LIBTPU_INIT_ARGS"] == f"--foo {B.LAUNCH_BARRIER}=false"
    # a shape we cannot derive (3 hosts) is the user's to give
    env3 = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "RANK": "0", "WORLD_SIZE": "12",
            "TPU_WORKER_HOSTNAMES": "a,b,c", "TPU_PROCESS_BOUNDS": "2,2,3"}
    b3 = B.plan(B.Host(tpu_chips=4, tpu_generation="v4", has_tpu_runtime=True), env3,
                run=B.launch(env3))
    assert b3.kept == {} and "TPU_PROCESS_BOUNDS" not in b3.variables and b3.notes
    with pytest.raises(B.BindingError, match="local rank 0 of 4"):
        B.plan(B.Host(tpu_chips=4, tpu_generation="v4", has_tpu_runtime=True),
               {k: v for k, v in env3.items() if k != "TPU_PROCESS_BOUNDS"}, run=B.launch(env3))


def test_launch_barrier_flag():
    jax_added = f" {B.LAUNCH_BARRIER}=true"  # what JAX appends at import on a TPU VM
    assert B.libtpu_args(jax_added) == f"{B.LAUNCH_BARRIER}=false"
    assert B.libtpu_args(None) == f"{B.LAUNCH_BARRIER}=false"
    assert B.libtpu_args("--x=1" + jax_added) == f"--x=1 {B.LAUNCH_BARRIER}=false"
    mine = f"{B.LAUNCH_BARRIER}=true --x=1"
    assert B.libtpu_args(mine) == mine  # the user asked for it


def test_a_process_alone_sets_nothing_on_tpu():
    b = B.plan(TPU_HOST, {}, run=None)
    assert b.platform == "tpu" and b.variables == {} and b.ordinal(4) == 0


GPU_HOST = B.Host(has_gpu=True, has_gpu_runtime=True, cores=16)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gpu_local_rank_only(world):
    for r in range(world):
        env = {"LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world)}
        b = B.plan(GPU_HOST, env, run=B.launch(env))
        assert b.platform == "cuda" and b.bound
        assert b.variables == {"JAX_LOCAL_DEVICE_IDS": str(r)}
        assert b.ordinal(1) == 0


def test_gpu_shared_devices_share_preallocation():
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "0,1"}
    b = B.plan(GPU_HOST, env, run=B.launch(env))
    assert not b.bound and b.variables == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.375"}
    assert b.ordinal(2) == 1
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "5"}
    b = B.plan(GPU_HOST, env, run=B.launch(env))  # each process given its own GPU
    assert b.variables == {} and b.ordinal(1) == 0
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "JAX_LOCAL_DEVICE_IDS": "1"}
    b = B.plan(GPU_HOST, env, run=B.launch(env))
    assert b.bound and b.variables == {}


def test_cpu_takes_the_local_ranks_device():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    b = B.plan(B.Host(cores=4), env, run=B.launch(env))
    assert b.platform == "cpu" and not b.bound and b.variables["NPROC"] == "2"
    assert [b.ordinal(n) for n in (1, 2, 4)] == [0, 1, 1]
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    assert B.plan(B.Host(cores=4), env, run=B.launch(env)).ordinal(2) == 1  # shared
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "NPROC": "3"}
    assert "NPROC" not in B.plan(B.Host(cores=4), env, run=B.launch(env)).variables


def test_tpu_chips_cannot_be_shared():
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "TPU_VISIBLE_CHIPS": "0,1"}
    b = B.plan(TPU_HOST, env, run=B.launch(env))
    b.bound = False  # (as if the runtime showed two chips to four processes)
    with pytest.raises(B.BindingError, match="4 processes on this host share 2 TPU"):
        b.ordinal(2)


@pytest.mark.parametrize("env,expected", [
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "6", "WORLD_SIZE": "8"},
     B.Launch(2, 4, 6, 8, "torchrun")),
    ({"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"},
     B.Launch(1, 4, 5, 8, "slurm")),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
      "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, B.Launch(0, 2, 2, 4, "openmpi")),
    ({}, None),
])
def test_launchers(env, expected):
    got = B.launch(env)
    assert got == expected
    if got is not None:
        assert got.hosts == got.world // got.local_world and got.host == got.rank // got.local_world


def test_process_group_without_a_launcher(monkeypatch):
    monkeypatch.setattr(B, "_GROUP_LAUNCH", [])
    for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    switched = []  # (the device indices of this test process stay as they are)
    monkeypatch.setattr(B._C, "set_local_device", lambda *a: switched.append(a))
    monkeypatch.setattr(B._C, "multi", lambda: True)  # (it saw every device)
    B.from_group(1, 2)  # mp.spawn: rank 1 of 2, one host
    assert B.launch() == B.Launch(1, 2, 1, 2, "process group")
    assert switched == [(1, 2)]  # tpu:1 of 2, as under torchrun


@pytest.mark.parametrize("requested,host,platform", [
    (None, TPU_HOST, "tpu"), ("cpu", TPU_HOST, "cpu"), (None, GPU_HOST, "cuda"),
    ("gpu", GPU_HOST, "cuda"), (None, B.Host(), "cpu"),
    (None, B.Host(tpu_chips=4, has_tpu_runtime=False), "cpu"),  # chips, no libtpu
])
def test_platform_choice(requested, host, platform):
    assert B.plan(host, {}, requested=requested).platform == platform


def test_a_failed_accelerator_start_raises_never_falls_back():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    b = B.plan(TPU_HOST, env, run=B.launch(env))
    busy = "The TPU is already in use by process with pid 4242"
    with pytest.raises(B.BindingError) as e:
        b.check_started("cpu", {"tpu": busy})
    text = str(e.value)
    assert busy in text and "local rank 1 of 4" in text
    assert "TPU_VISIBLE_CHIPS=1" in text and "TORCH_TPU_PLATFORM=cpu" in text
    b.check_started("tpu", {})  # started as meant
    gpu = B.plan(GPU_HOST, env, run=B.launch(env))
    gpu.check_started("gpu", {})  # (JAX's name for its CUDA devices' platform)
    with pytest.raises(B.BindingError, match="cuda runtime did not start"):
        gpu.check_started("cpu", {})
    B.plan(TPU_HOST, env, requested="cpu", run=B.launch(env)).check_started("cpu", {})
    assert "did not start: boom" in str(b.start_error(RuntimeError("boom")))


@pytest.mark.parametrize("host,env,count", [
    (TPU_HOST, {}, 4),                                                    # v5e, 4 chips
    (B.Host(tpu_chips=4, tpu_generation="tpu7x", has_tpu_runtime=True), {}, 8),  # 2 cores a chip
    (TPU_HOST, {"TPU_VISIBLE_CHIPS": "0,1"}, 2),
    (B.Host(has_gpu=True, has_gpu_runtime=True, gpus=8), {}, 8),
    (B.Host(has_gpu=True, has_gpu_runtime=True, gpus=8), {"CUDA_VISIBLE_DEVICES": "0,3,5"}, 3),
    (B.Host(), {"XLA_FLAGS": "--foo --xla_force_host_platform_device_count=4"}, 4),
    (B.Host(), {}, 1),
])
def test_device_count_before_the_start(host, env, count):
    """torch.tpu.device_count() of a process alone, read off the host without starting the
    runtime (a parent counting devices before it spawns must not hold them)."""
    assert B.local_devices(B.plan(host, env), host, env) == count
