"""The PJRT side: platform choice, x64 config, dtype maps, host <-> device transfers, what
a forked child may do, and XLA's out-of-memory error as torch's.

JAX must run with x64 enabled before any JAX work happens; otherwise int64 and float64
silently become 32-bit, and torch's int64 indices and float64 math would not stay exact.
"""
from __future__ import annotations

import contextlib
import os
import re
import warnings

import jax

jax.config.update("jax_enable_x64", True)

# Subnormal numbers (denormals) are flushed to zero on XLA:CPU, so float64
# `1e-300 * 1e-10` is 0.0 where torch's CPU gives 1e-310, and a subnormal input reads as 0.
# No setting of ours can change it (jaxlib 0.10.2): PJRT's CPU client runs every
# executable under tsl::port::ScopedFlushDenormal (FTZ and DAZ set in MXCSR for the call,
# xla/pjrt/cpu/cpu_client.cc), and XLA's intra-op pool threads set the same bits when they
# start. The DebugOptions flag `xla_cpu_ftz` (XLA_FLAGS or jit compiler_options) only
# changes LLVM's denormal-fp-math attribute; with it false the results still flush
# (tests/ops/test_refusals.py keeps a strict xfail that turns red once a jaxlib honours it).
# On the hardware this targets: TPUs flush float32 and bfloat16 subnormals to zero, and
# have no float64 units (XLA:TPU emulates float64 with pairs of float32, within float32's
# exponent range, so 1e-300 itself is out of reach); XLA:GPU keeps subnormals
# (`xla_gpu_ftz` defaults to false).

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from . import _C, _binding, _config, _cpu_kernels, _jax_internals, _waits, metrics  # noqa: E402

_cpu_kernels.install()  # (XLA:CPU's bf16 dot is ~10x slower than ATen's)
_jax_internals.reuse_ir_contexts()  # (each program's lowering would make its own)
_jax_internals.set_tracebacks(_config.get("TORCH_TPU_JAX_TRACEBACKS"))  # (~2 µs an op)

TORCH_TO_JAX = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(ml_dtypes.float8_e5m2),
    torch.float8_e4m3fnuz: jnp.dtype(ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: jnp.dtype(ml_dtypes.float8_e5m2fnuz),
    torch.float8_e8m0fnu: jnp.dtype(ml_dtypes.float8_e8m0fnu),  # MX block scales
}
JAX_TO_TORCH = {v: k for k, v in TORCH_TO_JAX.items()}

# numpy has no bfloat16 / float8 that torch.from_numpy understands: move those bytes as
# same-width integers and reinterpret on each side.
_HOST_CARRIER = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
    torch.float8_e8m0fnu: torch.uint8,
}


class UnsupportedDtypeError(TypeError):
    pass


def jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"tpu does not support dtype {dtype}; supported: "
            + ", ".join(str(d).replace("torch.", "") for d in TORCH_TO_JAX)
        ) from None


def torch_dtype(dtype) -> torch.dtype:
    return JAX_TO_TORCH[jnp.dtype(dtype)]


# Run once, right before the first use of the device starts JAX's backend. A layer above
# registers here instead of being imported by this one: tpu_dist joins JAX's distributed
# runtime then under torchrun, which must happen before the backend exists.
_BEFORE_BACKEND: list = []


def before_backend(fn) -> None:
    """Call `fn()` right before JAX's backend starts (register at import time)."""
    _BEFORE_BACKEND.append(fn)


def _select_devices() -> list:
    """The devices this process drives, bound to them before the runtime starts
    (_binding.py: libtpu's topology, the local GPU, XLA:CPU's share of the cores), and
    checked after: an accelerator that failed to start raises, never falls back to the CPU.
    One under a launcher (the local rank's); every local device for a process alone
    (`tpu:i` is local device i). `TORCH_TPU_PLATFORM` picks a platform (tpu, cuda, cpu)
    when several are installed."""
    global BINDING
    BINDING = _binding.current()
    _binding.apply(BINDING)
    for fn in _BEFORE_BACKEND:
        fn()
    try:
        devices = (jax.local_devices(backend=BINDING.platform) if BINDING.requested
                   else jax.local_devices())
    except RuntimeError as e:
        raise BINDING.start_error(e) from e
    BINDING.check_started(devices[0].platform, _jax_internals.backend_errors())
    if _C.multi():  # (its device count was read off the host before the start)
        if len(devices) != _C.local_device()[1]:
            raise _binding.BindingError(
                f"torch_tpu: this process expected {_C.local_device()[1]} local "
                f"{BINDING.platform} devices (torch.tpu.device_count()), and the runtime "
                f"started {len(devices)}")
        chosen = devices
    else:
        chosen = [devices[BINDING.ordinal(len(devices))]]
    # programs with no device inputs (factories, the RNG's first draw) run on JAX's
    # default device: make it tpu:0's, or they would land on local device 0
    jax.config.update("jax_default_device", chosen[0])
    return chosen


BINDING = None  # the binding used (_binding.Binding), once the device started
_DEVICES: list = []  # tpu index -> its PJRT device (one, or every local device: see above)
_slot = _C.slot  # this thread's current tpu index where a process has several, else 0


def device():
    """The PJRT device of this thread's current tpu device (the op's, inside an op)."""
    if _FORKED:
        raise RuntimeError(FORK_ERROR)
    if not _DEVICES:
        _DEVICES.extend(_select_devices())
    return _DEVICES[_slot()]


@contextlib.contextmanager
def on_device(index: int):
    """tpu:`index` as this thread's current device for a block (several devices per
    process; one: nothing changes)."""
    prev = _C.swap_index(index)
    try:
        yield
    finally:
        _C.swap_index(prev)


def devices() -> list:
    """Every PJRT device this process drives, by tpu index."""
    device()
    return list(_DEVICES)


def started() -> bool:
    """Whether XLA's runtime has started here (the first tpu tensor starts it, as on CUDA)."""
    return bool(_DEVICES)


# ---------------------------------------------------------------- fork
FORK_ERROR = ("Cannot re-initialize tpu in forked subprocess. To use tpu with "
              "multiprocessing, you must use the 'spawn' start method")
_FORKED = False


def _after_fork_in_child() -> None:
    """A child forked after XLA started inherits a runtime whose threads did not survive
    the fork: its next XLA call may hang forever. As CUDA does, the child is marked, and
    every path into tpu raises FORK_ERROR at once: the allocator and the op kernels in C,
    the transfers here. A child of a parent that never started XLA may start its own."""
    global _FORKED
    if _DEVICES:
        _FORKED = True
        _C.set_bad_fork(FORK_ERROR)


os.register_at_fork(after_in_child=_after_fork_in_child)
# JAX warns at every fork of a process whose backend started that a deadlock is likely;
# here the child raises instead, and a DataLoader's workers that make CPU tensors are safe.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)


def in_bad_fork() -> bool:
    return _FORKED


def check_not_forked() -> None:
    if _FORKED:
        raise RuntimeError(FORK_ERROR)


# ---------------------------------------------------------------- out of memory
_REQUEST = re.compile(r"allocat\w* (\d+) bytes")


def raise_if_out_of_memory(error: Exception, where: str = "") -> None:
    """Raise torch.OutOfMemoryError, in the allocator's words (csrc/memory.cpp), for an
    XLA error that says the device ran out of memory (RESOURCE_EXHAUSTED): XLA's own
    buffers (a program's temporaries, fragmentation on a TPU) are not in the count the
    allocator checks. Any other error: return, for the caller to re-raise."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return
    found = _REQUEST.search(text)
    cause = f" XLA{', ' + where if where else ''}: {text.splitlines()[0].strip()}"
    message = _C.out_of_memory_message(int(found.group(1)) if found else -1, cause)
    raise torch.OutOfMemoryError(message) from error


def to_device(cpu: torch.Tensor) -> jax.Array:
    """A contiguous CPU tensor -> a flat, device-owned XLA buffer (always a copy)."""
    check_not_forked()
    if cpu.numel() == 0:  # (transformers' caches start from torch.tensor([]) each step)
        key = (jax_dtype(cpu.dtype), _slot())
        empty = _EMPTY.get(key)
        if empty is None:
            empty = _EMPTY[key] = _uploader()(np.zeros(0, key[0]))
        return empty
    try:
        return _uploader()(host_array(cpu))
    except jax.errors.JaxRuntimeError as e:
        raise_if_out_of_memory(e, "copying a tensor to tpu")
        raise


def host_array(cpu: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's values as a private flat numpy array of its jax dtype:
    what an upload transfers (the transfer may alias host memory on XLA:CPU; a private
    copy keeps the torch tensor and the XLA buffer independent)."""
    jdt = jax_dtype(cpu.dtype)  # (a clear error for a dtype tpu lacks)
    if cpu.is_conj() or cpu.is_neg():  # lazy conj()/neg views: their values
        cpu = cpu.resolve_conj().resolve_neg()
    carrier = _HOST_CARRIER.get(cpu.dtype)
    # the copy is made by torch: numpy() marks the storage it views as not resizable, so
    # viewing the user's tensor would forbid its resize_ after an upload (and it is the
    # private copy that the numpy array keeps alive)
    cpu = cpu.detach().clone(memory_format=torch.contiguous_format)
    host = cpu.view(carrier).numpy().view(jdt) if carrier is not None else cpu.numpy()
    return host.reshape(-1)


_EMPTY: dict = {}  # (jax dtype, tpu index) -> its zero-length buffer (immutable: shared)


_UPLOADERS: dict = {}  # PJRT device -> its jitted identity


def _uploader():
    """A jitted identity placed on the current device: jit's C++ path moves a numpy argument
    to the device in ~20 us, where `jax.device_put`'s Python path takes 70-160 us (an input
    batch per training step)."""
    d = device()
    up = _UPLOADERS.get(d)
    if up is None:
        on_device = jax.sharding.SingleDeviceSharding(d)
        up = _UPLOADERS[d] = jax.jit(lambda a: a, in_shardings=on_device, out_shardings=on_device)
    return up


def scalar_to_device(v) -> jax.Array:
    """A Python number -> a weakly typed device scalar (it promotes like the number). Through
    the jitted identity: ~9 us, where `jax.device_put` takes ~65 us (AdamW's bias
    corrections are new numbers every step)."""
    check_not_forked()
    return _uploader()(v)


# Checks of every device value read to the host, registered by a layer above: tpu_dist
# raises there when a collective that may have fed the value failed or was refused (its
# zeros never reach user code), and replaces a raw XLA error from a failed collective.
_READ_GUARDS: list = []


def guard_reads(fn) -> None:
    """`fn(error)` runs after each read of device values (`to_host`, synchronize): with
    None once the values arrived (it may raise instead of letting them out), or with the
    exception the read raised (it may raise a clearer one). Register at import time."""
    _READ_GUARDS.append(fn)


def check_read(error: Exception | None = None) -> None:
    for fn in _READ_GUARDS:
        fn(error)


def to_host(arr: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """An XLA array -> a CPU tensor of `dtype` with the same shape (waits for the value)."""
    check_not_forked()
    _waits.begin(("a read to the host", arr))
    try:
        host = np.asarray(arr)
    except Exception as e:
        check_read(e)
        raise_if_out_of_memory(e, "computing a value read to the host")  # (an async failure)
        raise
    finally:
        _waits.end()
    if _READ_GUARDS:
        check_read()
    carrier = _HOST_CARRIER.get(dtype)
    if carrier is not None:
        host = host.view(TORCH_TO_JAX[carrier])
        return torch.from_numpy(np.array(host)).view(dtype)
    if not host.flags.writeable:
        host = np.array(host)
    return torch.from_numpy(host)


def platform() -> str:
    return device().platform


def jax_live_arrays():
    check_not_forked()
    return jax.live_arrays()


_FENCE: dict = {}  # PJRT device -> (its jit, its input): made on first use


def fence() -> None:
    """Wait for every program dispatched so far, those whose results nobody holds too
    (torch.tpu.synchronize: CUDA's waits for all queued work). A device runs the programs
    it was given in order (a TPU's or GPU's stream, and PJRT's CPU client: a dropped
    2048^3 matmul delays a 4-element add dispatched after it by the matmul's time), so
    waiting for a tiny program dispatched now on each device waits for all before it."""
    for d in devices():
        if d not in _FENCE:
            _FENCE[d] = (jax.jit(lambda x: x + 1), jax.device_put(np.zeros((), np.int32), d))
        fn, x = _FENCE[d]
        fn(x).block_until_ready()


# ---------------------------------------------------------------- direct calls
_DIRECT = _config.get("TORCH_TPU_C_FAST_PATH")


def direct_call(jitted, args, profiling=None):
    """`jitted`, already compiled for `args`, as a _C.DirectCall: its executable called
    through PJRT without jit's per-call dispatch (csrc/direct.cpp, which says why that is
    safe for an op entry or a compiled graph). `jitted` itself where a direct call would
    skip something jit does: effects, host callbacks, NaN/Inf checks (jax_debug_nans),
    argument layouts, arguments other than jax.Arrays, outputs other than a flat list or
    tuple or a pair of flat lists (a compiled graph's results and new buffers). While
    `profiling[0]` is true the direct call defers to jit, whose calls a device trace names."""
    array_type = _jax_internals.ArrayImpl
    if not _DIRECT or any(type(a) is not array_type for a in args):
        return jitted
    try:
        compiled = jitted.lower(*args).compile()  # (jax's caches: ~0.3 ms)
        parts = _jax_internals.plain_call(compiled)
        if parts is None:
            return jitted
        executable, kept, handlers = parts
        split = _out_split(compiled.out_tree, len(handlers))
        if split is None:
            return jitted
        fn = _C.DirectCall(jitted, executable, kept, handlers, array_type, metrics.counters,
                           "direct.fallbacks", len(args), split, profiling)
    except AttributeError:  # another jax's internals: keep jit's own call
        return jitted
    metrics.counters["direct.programs"] += 1
    return fn


def _out_split(tree, n):
    """How DirectCall gives back `n` outputs of this pytree: -1, as one list (a flat list
    or tuple: callers index it); k, as a pair of lists split at k; None, not at all."""
    shape = jax.tree_util.tree_structure
    if tree in (shape([0] * n), shape((0,) * n)):
        return -1
    kids = tree.children()
    if len(kids) == 2:
        k = kids[0].num_leaves
        if tree == shape(([0] * k, [0] * (n - k))):
            return k
    return None
