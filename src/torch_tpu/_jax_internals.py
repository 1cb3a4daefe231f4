"""Every private JAX piece torch_tpu uses, and the one module that imports them.

JAX keeps its implementation in `jax._src` and jaxlib's bindings (`jaxlib._jax`), which
change without notice between releases, so a JAX upgrade starts here. Each piece below is
one that no public API offers; all were read in jax and jaxlib JAX_VERSION, the version
pyproject.toml pins. `check_version()` fails on any other version, and
tests/unit/test_jax_internals.py resolves every piece on the installed JAX and fails on a
private JAX import anywhere else in the package. The pieces the package used to import
inside a function (at setup, at the backend's start) are still imported only when called.

  - `ArrayImpl` (jax._src.array), jax.Array's one concrete type. _runtime.direct_call:
    csrc/direct.cpp takes only this exact type and returns it (a subclass check would pass
    tracers' and other arrays' types). distributed/collectives: `_global` builds the
    group-wide array from this process's block with `ArrayImpl(aval, sharding, [block],
    committed=True, _skip_checks=True)`, and `local` reads back `arr._arrays[0]`, skipping
    the per-call checks and the new wrapper of make_array_from_single_device_arrays and
    addressable_data(0); both fall back to the public call on another JAX.
  - `convert_element_type` (jax._src.lax.lax._convert_element_type, with `weak_type=`).
    compile/lower._weak and lowering/optim._number: a Python number as a weakly typed JAX
    scalar, which promotes like a Python number inside the lowerings (what a traced scalar
    is in eager). lax.convert_element_type has no `weak_type` argument.
  - `plain_call(compiled)` (jax.stages.Compiled's `_executable.unsafe_call`, an
    ExecuteReplicated, and jax._src.dispatch.needs_check_special). _runtime.direct_call: the
    LoadedExecutable, the argument indices it reads and the result handlers, which
    csrc/direct.cpp calls through jaxlib's `execute_sharded` and `consume_with_handlers`,
    and whether jit's own call does more (effects, callbacks, NaN checks, layouts). The
    public Compiled object exposes none of these.
  - `set_persistent_cache(cache)` (jax._src.compilation_cache's `_cache` and its flags).
    _cache.setup and disable: _CheckedCache (checksums, atomic writes) as JAX's cache
    backend. The public settings choose only a directory for JAX's own backend.
  - `compile_events()` (jax._src.dispatch.BACKEND_COMPILE_EVENT, jax._src.compiler's
    "/jax/compilation_cache/cache_hits"). _cache._listen counts compiles and disk hits
    from them. Public jax.monitoring delivers the events, but their names are not public.
  - `backends_are_initialized()` (jax._src.xla_bridge). distributed/_bootstrap: whether
    the backend has started, without starting it (jax.devices() and
    jax.extend.backend.backends() start it), as jax.distributed.initialize must come first.
  - `tpu_chips()`, `has_nvidia_gpu()` (jax._src.hardware_utils) and `backend_errors()`
    (jax._src.xla_bridge._backend_errors). _binding: the host's chips before any runtime
    starts, and why an accelerator's runtime failed when JAX fell back to the CPU.
  - `kv_store()` (jax._src.distributed.global_state.client). distributed/collectives:
    each process publishes which of its local devices it drives, for the others' meshes.
  - `gloo_cpu_client(hostname)` (jaxlib _jax.make_gloo_tcp_collectives,
    jax._src.distributed.global_state.client, jax._src.xla_bridge.make_cpu_client).
    distributed/_bootstrap._use_gloo_on: XLA:CPU's gloo collectives listening on a chosen
    address (loopback for a one-machine job). `jax_cpu_collectives_implementation="gloo"`
    takes no address.
  - `forget_lowerings()` (jax._src.pjit._pjit_lower and jax._src.interpreters.pxla.
    _cached_lowering_to_hlo, both weakref-keyed LRU caches). _program_cache._first_run:
    jax keeps each jitted function's lowered StableHLO module while the function lives,
    ~1.1 MB per program on XLA:CPU (1.5 MB held per program in all, 0.3 MB without),
    though its executable is compiled and called without it. jax.clear_caches() would
    drop the compiled executables too.
  - `reuse_ir_contexts()` (jax._src.interpreters.mlir.ModuleContext and make_ir_context).
    _runtime at import: jit's lowering of every program builds its module in an MLIR
    context made for it, loading every dialect (~2.5 ms to make, and to destroy, on
    XLA:CPU's 2-core machine; a first training step lowers ~80 programs: 0.35-0.6 s of
    4.7-5.3 s). A thread's lowerings share one context, made anew after
    IR_CONTEXT_MODULES modules, which bounds what a context uniques (types, locations,
    constants) between renewals. Other users of make_ir_context keep their own.
  - `set_tracebacks(on)` (jaxlib._jax.set_tracebacks_enabled). _runtime at import
    (TORCH_TPU_JAX_TRACEBACKS): jaxlib records the Python stack at every executable call
    (each result array's `traceback`) and at every traced equation (its source info, MLIR
    locations). torch_tpu reads neither: its errors name the op and the user's line from
    its own frames (_frames.py). In a model's forward, ~40 frames deep, an add's call took
    13.1 µs with them and 11.0 without, and a warm GRPO step 6-10% less (2026-12-06).
  - `platform_lowering(primitive, platform)` (jax._src.interpreters.mlir.
    _platform_specific_lowerings). _cpu_kernels.install: the rule jax lowers `dot_general`
    with on XLA:CPU, which torch_tpu's CPU rule wraps (dots that do not qualify for ATen's
    kernel keep it). mlir.register_lowering, which installs the wrapper, is public; reading
    the rule it replaces is not.
"""
from __future__ import annotations

import jax
import jaxlib
# both modules are loaded by `import jax` itself: importing them here costs nothing
from jax._src.array import ArrayImpl  # noqa: F401  (re-exported)
from jax._src.lax.lax import _convert_element_type as convert_element_type  # noqa: F401

JAX_VERSION = "0.10.2"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # a literal in jax._src.compiler


def check_version() -> None:
    """Raise unless the installed jax and jaxlib are JAX_VERSION, the version every piece
    here was read in."""
    found = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    wrong = {name: v for name, v in found.items() if v != JAX_VERSION}
    if wrong:
        raise RuntimeError(
            f"torch_tpu's private JAX pieces were checked against jax and jaxlib {JAX_VERSION}, "
            f"but found {wrong}: check each piece in torch_tpu/_jax_internals.py against the "
            "new version, then update JAX_VERSION")


def plain_call(compiled):
    """(LoadedExecutable, sorted indices of the arguments it reads, list of result
    handlers) of a jit-compiled program, or None when jit's call does more than run it:
    effects, host callbacks, NaN/Inf checks, mutable arrays, profile-guided recompiles,
    argument layouts. Raises AttributeError on another JAX's internals."""
    from jax._src import dispatch

    call = compiled._executable.unsafe_call
    if (call.ordered_effects or call.has_unordered_effects or call.has_host_callbacks
            or dispatch.needs_check_special() or call.mut is not None
            or call.pgle_profiler is not None
            or any(x is not None for x in call.in_handler.in_layouts)):
        return None
    return call.xla_executable, tuple(sorted(call.kept_var_idx)), list(call.out_handler.handlers)


def set_persistent_cache(cache) -> None:
    """Make `cache` (get(key) -> bytes | None, put(key, bytes)) JAX's persistent
    compilation cache, or none with None. JAX evaluates again whether it uses the cache."""
    from jax._src import compilation_cache as cc

    with cc._cache_initialized_mutex:
        cc._cache = cache
        cc._cache_initialized = cache is not None
        cc._cache_checked = False
        if cache is None:
            cc._cache_used = False


def compile_events() -> tuple[str, str]:
    """(the event JAX records when an executable is loaded from the persistent cache, the
    duration event it records once for each executable it obtains, after that lookup)."""
    from jax._src.dispatch import BACKEND_COMPILE_EVENT

    return CACHE_HIT_EVENT, BACKEND_COMPILE_EVENT


def backends_are_initialized() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def tpu_chips() -> tuple:
    """(TPU chips on this host's PCI bus, their generation's name or None), by jax's probe
    (jax._src.hardware_utils), without starting any runtime."""
    from jax._src import hardware_utils

    count, version = hardware_utils.num_available_tpu_chips_and_device_id()
    return count, (version.name if version is not None else None)


def has_nvidia_gpu() -> bool:
    from jax._src import hardware_utils

    return hardware_utils.has_visible_nvidia_gpu()


def backend_errors() -> dict:
    """platform -> why its backend failed to start (jax._src.xla_bridge._backend_errors:
    JAX falls back to another platform with only a log line)."""
    from jax._src import xla_bridge

    return dict(xla_bridge._backend_errors)


def kv_store():
    """JAX's distributed client (jax._src.distributed.global_state.client): its key-value
    store (key_value_set, blocking_key_value_get) reaches every process of the job."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("JAX's distributed runtime is not initialized")
    return client


def gloo_cpu_client(hostname: str):
    """A CPU client whose cross-process collectives (gloo) listen on `hostname`, wired to
    JAX's distributed client (jax.distributed.initialize must have run)."""
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    make_collectives, make_client = _jax.make_gloo_tcp_collectives, xla_bridge.make_cpu_client
    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("gloo_cpu_client: JAX's distributed runtime is not initialized")
    return make_client(collectives=make_collectives(distributed_client=client, hostname=hostname))


def forget_lowerings() -> None:
    """Drop jax's cached lowerings of every jitted function (not their executables: jit's
    C++ cache keeps those, and a later call of the same signature runs them)."""
    from jax._src import pjit
    from jax._src.interpreters import pxla

    pjit._pjit_lower.cache_clear()
    pxla._cached_lowering_to_hlo.cache_clear()


def kept_arguments(closed_jaxpr) -> tuple:
    """Per argument of a traced function, whether jit keeps it in the program: jit drops
    the arguments nothing uses (keep_unused=False), and its results are committed to the
    device only when a kept argument is (Strict's compile window predicts that)."""
    from jax._src.interpreters import partial_eval as pe

    jaxpr = closed_jaxpr.jaxpr
    return tuple(pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))[1])


IR_CONTEXT_MODULES = 64  # modules lowered in one thread's MLIR context before a new one


def reuse_ir_contexts() -> None:
    """Let jit's lowerings in one thread share an MLIR context (see the top). Idempotent."""
    import threading

    from jax._src.interpreters import mlir

    init = mlir.ModuleContext.__init__
    if getattr(init, "torch_tpu_shared", False):
        return
    local = threading.local()

    def shared():
        ctx, used = getattr(local, "ctx", None), getattr(local, "used", 0)
        if ctx is None or used >= IR_CONTEXT_MODULES:
            local.ctx, used = mlir.make_ir_context(), 0
        local.used = used + 1
        return local.ctx

    def __init__(self, *args, context=None, **kwargs):
        init(self, *args, context=shared() if context is None else context, **kwargs)

    __init__.torch_tpu_shared = True
    mlir.ModuleContext.__init__ = __init__


def platform_lowering(primitive, platform: str):
    """The lowering rule jax uses for `primitive` on `platform` (its platform's own rule,
    else the default one)."""
    from jax._src.interpreters import mlir

    entry = mlir._platform_specific_lowerings[platform].get(primitive) or mlir._lowerings[primitive]
    return entry.rule


def set_tracebacks(on: bool) -> None:
    from jaxlib import _jax

    _jax.set_tracebacks_enabled(on)
