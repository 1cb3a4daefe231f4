"""Which chip this process drives: decided from the launcher's environment before XLA's
runtime starts, applied as the variables the runtime reads then, and checked once it runs.

A TPU or GPU runtime binds a process to its chips only when it starts, and neither does it
by itself under torchrun:
  - libtpu reads the topology variables below when it starts. Without them the first
    process of a host takes every chip and a host-wide lock, and the next one is refused
    ("The TPU is already in use by process with pid N").
  - JAX's CUDA client opens every visible GPU unless `jax_cuda_visible_devices` (what
    `JAX_LOCAL_DEVICE_IDS` and `jax.distributed.initialize(local_device_ids=...)` set) says
    otherwise; JAX finds the local rank by itself under Slurm and Open MPI only. Unbound,
    every rank would compute on GPU 0.
  - XLA:CPU devices belong to one process each, so on the CPU nothing is bound before the
    start: with several devices visible (`--xla_force_host_platform_device_count=N`, the
    simulation of a GPU host) the process takes its local rank's device afterwards.

The decisions are pure functions of the launch and of the host's facts (`plan`), so each
generation's table and each launcher is unit-tested here without the hardware; `apply`
and `Binding.device` are the only side effects. A variable the user set always wins.
The values follow libtpu's documented variables and torch_xla's published topology
handling for one process per chip (chip bounds `1,1,1` per process, process bounds the
slice's chip grid, one port per local process from 8476, task id host-major).
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os

from . import _C, _config

TPU_VARIABLES = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
                 "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT", "CLOUD_TPU_TASK_ID",
                 "ALLOW_MULTIPLE_LIBTPU_LOAD")
TPU_BASE_PORT = 8476  # libtpu's default process port; local process i listens on base + i
# JAX adds this flag set to true when it is imported on a TPU VM (jax/_src/cloud_tpu_init.py);
# with several processes per host the barrier can hang the launch, so it is turned off then.
LAUNCH_BARRIER = "--xla_tpu_use_enhanced_launch_barrier"


_PLATFORM = {"gpu": "cuda"}  # (JAX names its CUDA devices' platform "gpu")


class BindingError(RuntimeError):
    """The accelerator could not be bound to this process (busy, bad topology, too few)."""


# ---------------------------------------------------------------- the launch
@dataclasses.dataclass(frozen=True)
class Launch:
    """This process's place in a job: local rank of the processes on its host, and global."""
    local_rank: int
    local_world: int
    rank: int
    world: int
    launcher: str

    @property
    def hosts(self) -> int:
        return max(1, self.world // self.local_world)

    @property
    def host(self) -> int:
        return self.rank // self.local_world


# (launcher, local rank, processes on the host, global rank, processes in all): torchrun
# and `accelerate launch` set the first; Slurm's srun and Open MPI's mpirun their own.
_LAUNCHERS = (
    ("torchrun", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"),
    ("slurm", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_PROCID", "SLURM_NTASKS"),
    ("openmpi", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
)
_GROUP_LAUNCH: list = []  # set by init_process_group before the start (mp.spawn): see below


def _int(env, name):
    value = env.get(name, "").strip()
    return int(value.split("(")[0].split(",")[0]) if value else None  # Slurm's "4(x2)"


def launch(env=None) -> Launch | None:
    """The launch the environment describes, or the process group's (`from_group`), or
    None for a process that is alone on its host."""
    env = os.environ if env is None else env
    for name, lr, lw, r, w in _LAUNCHERS:
        local_rank, local_world = _int(env, lr), _int(env, lw)
        if local_rank is None or local_world is None:
            continue
        rank = _int(env, r)
        world = _int(env, w)
        return Launch(local_rank, local_world, local_rank if rank is None else rank,
                      local_world if world is None else world, name)
    return _GROUP_LAUNCH[0] if _GROUP_LAUNCH else None


def from_group(rank: int, world: int) -> None:
    """A process group joined before the device started, with no launcher's variables
    (torch.multiprocessing.spawn, a launcher of one's own): its processes are taken to
    share one host, rank r on local chip r (the CUDA idiom `set_device(rank)`). A process
    that saw several devices then names its one tpu:r, as under torchrun."""
    if launch() is None and world > 1:
        _GROUP_LAUNCH.append(Launch(rank, world, rank, world, "process group"))
        if _C.multi():  # it saw every device (the CUDA case): now tpu:{rank} of world, as
            _C.set_local_device(rank, world)  # under torchrun; with one, tpu:0 names it


# ---------------------------------------------------------------- TPU generations
@dataclasses.dataclass(frozen=True)
class Generation:
    name: str
    host_grids: dict      # chips on one host -> their (x, y, z) grid
    pod_host_chips: int   # chips per host in a slice of several hosts
    torus: bool           # 3-D slices (hosts stack along z, then y, then x) or 2-D (x, y)
    cores_per_chip: int   # JAX devices per chip


# Cloud TPU's published slice shapes: v4 and v5p hosts hold 4 chips (2x2x1) and slices
# are 3-D tori (v4-16 is 2x2x2); v5e and v6e single hosts hold 1, 4 (2x2) or 8 (2x4)
# chips, their multi-host slices are made of 4-chip hosts in a 2-D grid (v5litepod-16 is
# 4x4); TPU7x (Ironwood) hosts hold 4 chips in 3-D slices, each chip two TensorCores
# that JAX shows as two devices.
GENERATIONS = {
    "v4": Generation("v4", {4: (2, 2, 1)}, 4, True, 1),
    "v5p": Generation("v5p", {4: (2, 2, 1)}, 4, True, 1),
    "v5e": Generation("v5e", {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}, 4, False, 1),
    "v6e": Generation("v6e", {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}, 4, False, 1),
    "v7x": Generation("v7x", {4: (2, 2, 1)}, 4, True, 2),
}
# How an accelerator type (TPU_ACCELERATOR_TYPE, "v5litepod-16") or jax's PCI probe names one.
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "tpu7x": "v7x", "7x": "v7x", "v6": "v6e"}


def generation(name: str) -> Generation:
    base = name.strip().lower().split("-")[0]
    base = _ALIASES.get(base, base)
    if base not in GENERATIONS:
        raise BindingError(f"unknown TPU generation {name!r}; known: {', '.join(GENERATIONS)}")
    return GENERATIONS[base]


def host_grid(gen: Generation, hosts: int) -> tuple:
    """How `hosts` hosts of `gen.pod_host_chips` chips tile a slice: each doubling of the
    slice doubles its shortest side, z before y before x on a tie (3-D: v4-16 2x2x2, v4-32
    2x2x4, v4-64 2x4x4), y before x (2-D: v5litepod-16 4x4, -32 4x8, -64 8x8)."""
    if hosts & (hosts - 1):
        raise BindingError(f"{gen.name}: a slice of {hosts} hosts has no published shape "
                           "(set TPU_PROCESS_BOUNDS yourself)")
    chip = gen.host_grids[gen.pod_host_chips]
    extent = list(chip)
    order = (2, 1, 0) if gen.torus else (1, 0)
    for _ in range(hosts.bit_length() - 1):
        axis = min(order, key=lambda a: (extent[a], order.index(a)))
        extent[axis] *= 2
    return tuple(e // c for e, c in zip(extent, chip))


def _split(grid: tuple, parts: int) -> tuple:
    """Each of `parts` processes' block of a host's chip grid: the slowest axes split
    first, so each process's chips are consecutive in libtpu's numbering (x fastest)."""
    block, left = list(grid), parts
    for axis in (2, 1, 0):
        g = math.gcd(block[axis], left)
        block[axis] //= g
        left //= g
    if left != 1:
        raise BindingError(f"{parts} processes cannot share a host's {grid_text(grid)} chips evenly")
    return tuple(block)


def grid_text(grid) -> str:
    return ",".join(str(d) for d in grid)


def tpu_variables(gen: Generation, chips_on_host: int, run: Launch,
                  host_addresses: list | None = None) -> dict:
    """libtpu's topology variables for `run.local_world` processes on each of `run.hosts`
    hosts of `chips_on_host` chips each."""
    hosts, n = run.hosts, run.local_world
    if hosts > 1 and chips_on_host != gen.pod_host_chips:
        raise BindingError(f"{gen.name}: hosts of a multi-host slice hold {gen.pod_host_chips} "
                           f"chips; this one shows {chips_on_host}")
    grid = gen.host_grids.get(chips_on_host)
    if grid is None:
        raise BindingError(f"{gen.name}: no published host of {chips_on_host} chips "
                           f"(known: {sorted(gen.host_grids)})")
    block = _split(grid, n)
    per_host = tuple(g // b for g, b in zip(grid, block))
    slice_hosts = host_grid(gen, hosts)
    processes = tuple(p * h for p, h in zip(per_host, slice_hosts))
    chips = math.prod(block)
    first = run.local_rank * chips
    if host_addresses is None:
        if hosts > 1:
            raise BindingError(
                f"{hosts} hosts with {n} processes each: libtpu needs every host's address; "
                "set TPU_WORKER_HOSTNAMES (comma-separated, in host order) or TPU_PROCESS_ADDRESSES")
        host_addresses = ["localhost"]
    ports = [TPU_BASE_PORT + i for i in range(n)]
    return {
        "TPU_VISIBLE_CHIPS": ",".join(str(c) for c in range(first, first + chips)),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": grid_text(block),
        "TPU_PROCESS_BOUNDS": grid_text(processes),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{h}:{p}" for h in host_addresses for p in ports),
        "TPU_PROCESS_PORT": str(ports[run.local_rank]),
        "CLOUD_TPU_TASK_ID": str(run.host * n + run.local_rank),
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }


def libtpu_args(current: str | None) -> str:
    """LIBTPU_INIT_ARGS for several processes per host: JAX's launch barrier (the flag JAX
    appends, set to true) turned off; a setting of the flag elsewhere is the user's, kept."""
    jaxs = f" {LAUNCH_BARRIER}=true"
    args = (current or "").removesuffix(jaxs)
    if LAUNCH_BARRIER in args:
        return current
    return f"{args} {LAUNCH_BARRIER}=false".strip()


# ---------------------------------------------------------------- GPU
GPU_PREALLOCATE = 0.75  # JAX's default XLA_PYTHON_CLIENT_MEM_FRACTION


def gpu_variables(run: Launch, env) -> dict:
    """The local rank's GPU only (JAX_LOCAL_DEVICE_IDS); where the user's CUDA_VISIBLE_DEVICES
    leaves several processes per GPU, each preallocates its share of JAX's 75%."""
    out = {}
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None and "JAX_LOCAL_DEVICE_IDS" not in env:
        out["JAX_LOCAL_DEVICE_IDS"] = str(run.local_rank)
    elif visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
        sharing = math.ceil(run.local_world / count) if 1 < count < run.local_world else 1
        if sharing > 1:
            out["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{GPU_PREALLOCATE / sharing:.3f}"
    return out


# ---------------------------------------------------------------- the plan
@dataclasses.dataclass
class Binding:
    """What this process does about its chips: the platform it means to use, the variables
    it sets before the runtime starts (those the user set are kept, and listed apart), and
    whether the runtime then sees only this process's chips (`bound`)."""
    platform: str                  # "tpu", "cuda", "cpu": what the start must give
    requested: bool                # named by TORCH_TPU_PLATFORM
    run: Launch | None
    variables: dict = dataclasses.field(default_factory=dict)   # set by us
    kept: dict = dataclasses.field(default_factory=dict)        # the user's, which win
    bound: bool = False
    notes: list = dataclasses.field(default_factory=list)

    def describe(self) -> list:
        """(name, value) lines for `python -m torch_tpu info`."""
        run = self.run
        where = ("a process alone on its host" if run is None else
                 f"local rank {run.local_rank} of {run.local_world} on host {run.host} of "
                 f"{run.hosts} ({run.launcher})")
        lines = [("binding", f"{self.platform}{' (TORCH_TPU_PLATFORM)' if self.requested else ''}"
                  f", {where}")]
        lines += [(k, f"{v} (set here)") for k, v in self.variables.items()]
        lines += [(k, f"{v} (yours, kept)") for k, v in self.kept.items()]
        lines += [("note", n) for n in self.notes]
        return lines

    def ordinal(self, visible: int) -> int:
        """Which of the `visible` local devices the runtime shows is this process's: the
        only one once bound, else the local rank's (shared round-robin where the user made
        fewer devices visible than processes: GPUs and XLA:CPU devices can be shared, a
        TPU chip cannot)."""
        run = self.run
        if self.bound or run is None or visible == 1:
            return 0
        if visible < run.local_world and self.platform == "tpu":
            raise BindingError(self._where(f"{run.local_world} processes on this host share "
                                           f"{visible} TPU devices visible to each"))
        return run.local_rank % visible

    def check_started(self, platform: str, errors: dict) -> None:
        """Raise when the runtime started on another platform than the one meant (JAX falls
        back to the CPU with a warning when an accelerator fails to start)."""
        if _PLATFORM.get(platform, platform) == self.platform or self.platform == "cpu":
            return
        cause = errors.get(self.platform) or f"JAX started the {platform} platform instead"
        raise BindingError(self._where(f"the {self.platform} runtime did not start: {cause}"))

    def start_error(self, error: Exception) -> BindingError:
        return BindingError(self._where(f"the {self.platform} runtime did not start: {error}"))

    def _where(self, what: str) -> str:
        run = self.run
        who = ("this process" if run is None else
               f"local rank {run.local_rank} of {run.local_world} ({run.launcher})")
        both = {**self.variables, **self.kept}
        seen = ", ".join(f"{k}={v}" for k, v in both.items()) or "none"
        return (f"torch_tpu: {who}: {what}. Variables for the runtime: {seen}. tpu does not "
                f"fall back to the CPU by itself: TORCH_TPU_PLATFORM=cpu asks for it.")


@dataclasses.dataclass(frozen=True)
class Host:
    """What the machine has, before any runtime starts (jax's PCI probe, the plugins)."""
    tpu_chips: int = 0
    tpu_generation: str | None = None
    has_tpu_runtime: bool = False
    has_gpu: bool = False
    has_gpu_runtime: bool = False
    cores: int = 1
    gpus: int = 0


def plan(host: Host, env=None, requested: str | None = None, run: Launch | None = None) -> Binding:
    """The binding for this launch on this host (pure: `env` is only read)."""
    env = os.environ if env is None else env
    if requested:
        platform = _PLATFORM.get(requested, requested)
    elif host.has_tpu_runtime and host.tpu_chips:
        platform = "tpu"
    elif host.has_gpu_runtime and host.has_gpu:
        platform = "cuda"
    else:
        platform = "cpu"
    b = Binding(platform, bool(requested), run)
    wanted = {}
    if run is not None and run.local_world > 1:
        if platform == "tpu":
            hostnames = env.get("TPU_WORKER_HOSTNAMES")
            try:
                gen = generation(env.get("TPU_ACCELERATOR_TYPE") or host.tpu_generation or "")
                wanted.update(tpu_variables(gen, host.tpu_chips, run,
                                            hostnames.split(",") if hostnames else None))
            except BindingError as e:  # a shape we cannot derive: the user's own, if any
                if not any(k in env for k in TPU_VARIABLES[:6]):
                    raise BindingError(b._where(str(e))) from None
                b.notes.append(f"topology taken as the user set it ({e})")
            wanted["LIBTPU_INIT_ARGS"] = libtpu_args(env.get("LIBTPU_INIT_ARGS"))
            b.bound = True
        elif platform == "cuda":
            wanted.update(gpu_variables(run, env))
            b.bound = "JAX_LOCAL_DEVICE_IDS" in wanted or "JAX_LOCAL_DEVICE_IDS" in env
        elif "NPROC" not in env and "PJRT_NPROC" not in env:
            threads = _config.get("TORCH_TPU_XLA_CPU_THREADS")
            wanted["NPROC"] = str(threads or max(1, host.cores // run.local_world))
    elif platform == "cpu":
        threads = _config.get("TORCH_TPU_XLA_CPU_THREADS")
        if threads is not None and "NPROC" not in env and "PJRT_NPROC" not in env:
            wanted["NPROC"] = str(threads)
    for k, v in wanted.items():
        if k in env and k != "LIBTPU_INIT_ARGS":
            b.kept[k] = env[k]
        else:
            b.variables[k] = v
    return b


def local_devices(b: Binding, host: Host, env=None) -> int:
    """How many local devices the runtime will show this process, known before it starts
    (torch.tpu.device_count() must not start it: a parent that counts devices before
    spawning one process per device would hold them all)."""
    env = os.environ if env is None else env
    if b.platform == "tpu":
        visible = env.get("TPU_VISIBLE_CHIPS")
        chips = len(visible.split(",")) if visible else host.tpu_chips
        gen = env.get("TPU_ACCELERATOR_TYPE") or host.tpu_generation
        cores = generation(gen).cores_per_chip if gen else 1
        return max(1, chips * cores)
    if b.platform == "cuda":
        visible = env.get("JAX_LOCAL_DEVICE_IDS") or env.get("CUDA_VISIBLE_DEVICES")
        return max(1, len([d for d in visible.split(",") if d.strip()]) if visible is not None
                   else host.gpus)
    flag = "--xla_force_host_platform_device_count="
    for word in env.get("XLA_FLAGS", "").split():
        if word.startswith(flag):
            return max(1, int(word[len(flag):]))
    return 1


def apply(b: Binding) -> None:
    """Set the plan's variables (before the runtime starts) and, for a GPU, JAX's visible
    devices: JAX applies JAX_LOCAL_DEVICE_IDS only inside jax.distributed.initialize."""
    os.environ.update(b.variables)
    ids = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    if b.platform == "cuda" and b.bound and ids:
        import jax

        jax.config.update("jax_cuda_visible_devices", ids)


def host() -> Host:
    """This machine's facts (jax's PCI probe for TPU chips, the installed PJRT plugins)."""
    import importlib.util

    from . import _jax_internals

    chips, gen = _jax_internals.tpu_chips()
    gpu_plugin = any(importlib.util.find_spec(m) is not None
                     for m in ("jax_cuda13_plugin", "jax_cuda12_plugin"))
    return Host(tpu_chips=chips, tpu_generation=gen,
                has_tpu_runtime=importlib.util.find_spec("libtpu") is not None,
                has_gpu=_jax_internals.has_nvidia_gpu(), has_gpu_runtime=gpu_plugin,
                cores=len(os.sched_getaffinity(0)),
                gpus=len(glob.glob("/dev/nvidia[0-9]*")))


def devices_alone() -> int:
    """The local devices this process drives when no launcher started it: all it will see
    (1 under a launcher: the local rank's)."""
    if launch() is not None:
        return 1
    h = host()
    return local_devices(plan(h, requested=_config.get("TORCH_TPU_PLATFORM")), h)


def current() -> Binding:
    """The plan for this process as it is launched now."""
    return plan(host(), requested=_config.get("TORCH_TPU_PLATFORM"), run=launch())
