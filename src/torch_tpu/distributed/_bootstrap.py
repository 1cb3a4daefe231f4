"""JAX's multi-controller runtime under torch's rendezvous: one JAX process per torch rank.

`jax.distributed.initialize` must run before JAX creates its backend (the backend's
collectives are wired to the distributed client at creation), so this runs:
  - in the `tpu_dist` creator, i.e. inside `init_process_group`, when nothing has touched
    the tpu device yet (the usual order: init first, then `model.to("tpu")`);
  - or earlier, from `before_backend()`, which `_runtime` calls right before it starts the
    backend: under torchrun the rendezvous store (the agent's) is reachable before
    `init_process_group`, so a script that touches tpu first still works there.

The coordinator address comes from the torch rendezvous: rank 0 picks a free port on its
own address and publishes `host:port` through the torch store; the others read it. The
JAX process id is the torch global rank.

Failure policy (a hung job is the worst outcome):
  - a process that dies with an uncaught exception tells the others (through the links of
    `_liveness.py`) and exits at once, skipping JAX's shutdown barrier, so its peers stop
    within a second instead of waiting in a collective until their timeout;
  - `fail()` is the one place a fatal distributed error is reported (a failed, refused or
    timed-out collective, a peer's death): the first one is printed once, naming the rank
    at fault, and the process exits, as NCCL's async error handling does. With
    TORCH_TPU_DIST_ASYNC_ERROR_HANDLING=0 it is printed and kept instead: every later
    collective and every read of a device value raises it.
"""
from __future__ import annotations

import atexit
import ipaddress
import os
import socket
import sys
import threading
import time
import traceback

from .. import _binding, _config, _jax_internals
from . import _liveness

_state = {"rank": None, "world": None, "host": None, "crashed": None, "hooks": False,
          "failure": None, "failure_cls": None}
_lock = threading.RLock()
_fail_lock = threading.Lock()
_KEY = "tpu_dist/jax_coordinator"
_ABORT = _config.get("TORCH_TPU_DIST_ASYNC_ERROR_HANDLING")
_crash_hooks: list = []  # called with the uncaught exception before a crashed process exits
_context_hooks: list = []  # -> what this rank was doing (the collective in flight), or ""


class DistInitError(RuntimeError):
    pass


def is_initialized() -> bool:
    return _state["world"] is not None


def rank() -> int:
    return _state["rank"]


def world() -> int:
    return _state["world"] or 1


def host() -> str:
    """The address this process's peers reach it at (its gloo connections listen there)."""
    return _state["host"] or "127.0.0.1"


def backend_started() -> bool:
    return _jax_internals.backends_are_initialized()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return host in ("localhost",)


def _own_address(peer_host: str | None) -> str:
    """The address other ranks can reach this host at: TORCH_TPU_DIST_HOSTNAME if set,
    loopback when the rendezvous itself is on loopback (one machine), else the address of
    the interface that routes to the rendezvous host."""
    forced = _config.get("TORCH_TPU_DIST_HOSTNAME")
    if forced:
        return forced
    if peer_host is None or _is_loopback(peer_host):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(peer_host), 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _publish_or_read(store, rank_: int, timeout: float) -> str:
    """Rank 0 publishes the coordinator address in the torch store; the others wait for it
    (the store's own timeout, which init_process_group sets, bounds the wait)."""
    explicit = _config.get("TORCH_TPU_COORDINATOR")
    if rank_ == 0:
        host = _own_address(os.environ.get("MASTER_ADDR"))
        # the links' hub first: whoever reads the coordinator's address finds it too
        store.set(_liveness.KEY, _liveness.listen(host))
        addr = explicit or f"{host}:{_free_port(host)}"
        store.set(_KEY, addr)
        return addr
    if explicit:
        return explicit
    try:
        return store.get(_KEY).decode()
    except Exception as e:  # noqa: BLE001  (DistStoreError, timeouts)
        raise DistInitError(
            f"tpu_dist: rank {rank_} did not receive the JAX coordinator address from rank 0 "
            f"within the rendezvous timeout ({timeout:.0f} s): rank 0 has not started or "
            f"died ({e})") from e


def _use_gloo_on(host: str) -> None:
    """Make XLA:CPU's cross-process collectives (gloo) listen on `host`, so a one-machine
    job talks over loopback only. Installed as JAX's "cpu" backend factory, which runs when
    the backend starts, after the distributed client exists."""
    import jax
    import jax.extend.backend

    if jax.config.jax_cpu_collectives_implementation not in (None, "gloo"):
        return
    jax.extend.backend.register_backend_factory(
        "cpu", lambda: _jax_internals.gloo_cpu_client(host), priority=0, fail_quietly=False)


def initialize(store, rank_: int, world: int, timeout: float) -> None:
    """Join (or check) JAX's distributed runtime as process `rank_` of `world`."""
    with _lock:
        if is_initialized():
            if (_state["rank"], _state["world"]) != (rank_, world):
                raise DistInitError(
                    f"tpu_dist: this process already joined JAX's distributed runtime as rank "
                    f"{_state['rank']} of {_state['world']}, and is now asked to be rank "
                    f"{rank_} of {world}. JAX's runtime lives as long as the process: "
                    "re-initialize with the same rank and world size, or start new processes.")
            return
        if world == 1:
            _state.update(rank=0, world=1)
            return
        if backend_started():
            raise DistInitError(_started_too_early())
        _binding.from_group(rank_, world)  # (mp.spawn: no launcher's variables to bind by)
        addr = _publish_or_read(store, rank_, timeout)
        links = None if rank_ == 0 else store.get(_liveness.KEY).decode()
        _start(addr, links, rank_, world, timeout)


def _start(addr: str, links: str | None, rank_: int, world: int, timeout: float) -> None:
    import jax

    host, port = addr.rsplit(":", 1)
    loopback = _is_loopback(host)
    own = _config.get("TORCH_TPU_DIST_HOSTNAME") or (
        "127.0.0.1" if loopback else _own_address(host))
    if jax.config.jax_platforms in (None, "", "cpu") or loopback:
        _use_gloo_on(own)
    # Heartbeats detect a dead process that is not in a collective; a process in a
    # collective sees the closed connection at once.
    heartbeat = _config.get("TORCH_TPU_DIST_HEARTBEAT_S")
    if heartbeat is None:
        heartbeat = int(min(max(timeout, 10), 60))
    # The JAX preemption service only polls the coordinator; it has no use here and its
    # warnings would bury the real error when a peer dies.
    jax.config.update("jax_enable_preemption_service", False)
    # JAX's client on the other ranks goes through a relay, so that rank 0's death is
    # reported by tpu_dist, naming rank 0, instead of JAX's instant absl FATAL
    jax_addr = addr if rank_ == 0 else _liveness.relay(addr)
    jax.distributed.initialize(
        coordinator_address=jax_addr, num_processes=world, process_id=rank_,
        local_device_ids=None, cluster_detection_method="deactivate",
        initialization_timeout=max(int(timeout), 1),
        heartbeat_timeout_seconds=heartbeat,
        shutdown_timeout_seconds=max(int(timeout), 1),
        coordinator_bind_address=f"{host}:{port}" if loopback else None)
    _state.update(rank=rank_, world=world, host=own)
    _install_exit_hooks()
    if rank_ != 0:
        _liveness.arm()
        try:
            _liveness.connect(links, rank_, timeout)
        except OSError as e:
            raise DistInitError(f"tpu_dist: rank {rank_} could not link to rank 0 at {links} "
                                f"(rank 0 died during start-up?): {e}") from e


def _started_too_early() -> str:
    """Why the device could not join the runtime, for the way this process was launched."""
    msg = ("tpu_dist: the tpu device (JAX's backend) was already in use in this process before "
           "init_process_group, and JAX's distributed runtime must start before its backend. ")
    env = os.environ
    fix = ("Call dist.init_process_group('tpu_dist') before creating tpu tensors or moving a "
           "model to tpu.")
    if not env.get("TORCHELASTIC_RUN_ID"):
        return msg + ("This process was not started by torchrun (mp.spawn or a launcher of "
                      "its own), so nothing joined the runtime earlier. " + fix +
                      " Under torchrun the device's first use joins it by itself.")
    if not _config.get("TORCH_TPU_DIST_EARLY_INIT"):
        return msg + ("Under torchrun the device's first use joins the runtime, but "
                      "TORCH_TPU_DIST_EARLY_INIT=0 turns that off here. " + fix)
    return msg + ("Under torchrun the device's first use joins the runtime only with torchrun's "
                  "agent store (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR/MASTER_PORT, "
                  "WORLD_SIZE > 1), which this launch lacks. " + fix)


# ---------------------------------------------------------------- early start (torchrun)
def before_backend() -> None:
    """Called by `_runtime` right before JAX's backend starts (registered by
    `distributed.register()`). Under torchrun (its agent hosts the rendezvous store) join
    the runtime now, so a script that touches the tpu device before init_process_group
    still gets a distributed backend. Elsewhere (mp.spawn, a single process) do nothing:
    init_process_group does it."""
    if is_initialized() or not _config.get("TORCH_TPU_DIST_EARLY_INIT"):
        return
    if backend_started():  # started without `_runtime`: init_process_group says why it fails
        return
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1 or not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        return
    import datetime

    from torch.distributed import PrefixStore, TCPStore

    timeout = float(_config.get("TORCH_TPU_DIST_INIT_TIMEOUT_S"))
    store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, False,
                     datetime.timedelta(seconds=timeout))
    run = f"{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    initialize(PrefixStore(f"tpu_dist_early/{run}/", store), _env_int("RANK", 0), world, timeout)


# ---------------------------------------------------------------- failing fast
def _install_exit_hooks() -> None:
    if _state["hooks"]:
        return
    _state["hooks"] = True
    previous = sys.excepthook

    def excepthook(tp, value, tb):
        # A raw XLA error from a failed collective can surface at an op that consumed the
        # collective's result: a crash hook gives the collective's own error instead (or,
        # with async error handling on, reports it and exits: `fail`).
        for hook in _crash_hooks:
            try:
                better = hook(value)
            except Exception:  # noqa: BLE001
                better = None
            if better is not None:
                tp, value = type(better), better
                break
        _state["crashed"] = "".join(traceback.format_exception_only(tp, value)).strip()
        with _fail_lock:  # a watchdog's exit waits until the traceback is out
            previous(tp, value, tb)

    sys.excepthook = excepthook
    # Registered after JAX's own atexit handlers, so it runs first.
    atexit.register(_at_exit)
    _liveness.on_lost(peer_lost)


def _at_exit() -> None:
    if _state["crashed"]:
        _liveness.leaving("error", f"uncaught {_state['crashed']}")
        _hard_exit(1)
    if _state["failure"] is not None:
        # the script caught the error and ended; JAX's shutdown barrier would wait for
        # the rank that failed, so leave without it, with the job's failure as the status
        _liveness.leaving("error", _state["failure"])
        _hard_exit(1)
    _liveness.leaving("ok")


def _hard_exit(code: int) -> None:
    """Leave without JAX's shutdown barrier: it would wait for peers that are themselves
    waiting for this process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def failure() -> str | None:
    """The fatal distributed error this process recorded, if any."""
    return _state["failure"]


def failure_error() -> Exception:
    """The recorded failure as the exception to raise."""
    import torch.distributed as dist

    return (_state["failure_cls"] or dist.DistBackendError)(_state["failure"])


def raise_if_failed() -> None:
    if _state["failure"] is not None:
        raise failure_error()


def fail(message: str, cls=None) -> Exception:
    """Report a fatal distributed error, from any thread. The first one is printed, once;
    with async error handling on (the default) the process then exits, so this returns
    only with it off, giving the error for the caller to raise (every later collective
    and device read raises it too: `cls`, default DistBackendError)."""
    with _fail_lock:
        if _state["failure"] is None:
            _state["failure"], _state["failure_cls"] = message, cls
            note = (" Exiting this process so the job does not hang "
                    "(TORCH_TPU_DIST_ASYNC_ERROR_HANDLING=0 to raise instead)." if _ABORT else "")
            _write(f"[tpu_dist rank {_state['rank']} {time.strftime('%H:%M:%S')}] "
                   f"{message}{note}")
        if _ABORT:  # inside the lock: a second caller waits here for the exit
            _liveness.leaving("error", _state["failure"])
            _hard_exit(1)
    return failure_error()


def _write(text: str) -> None:
    try:  # flush what Python buffered, then write straight to the file descriptor: the
        # main thread may be inside a write to the same stream, whose buffer this
        # thread then cannot flush before the exit
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    try:
        os.write(2, f"\n{text}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def peer_lost(rank_: int, how: str, detail: str) -> None:
    """A peer died (its link closed without a word) or stopped on an error (it said so)."""
    if how == "died":
        what = (f"rank {rank_} died: its process ended without a word (killed by a signal "
                "such as SIGKILL or the OOM killer, or crashed in native code); see its log "
                "and exit status.")
        if rank_ == 0:
            what += " Rank 0 also ran JAX's coordination service, so the job cannot go on."
    else:
        detail = detail.strip().removeprefix("tpu_dist: ")
        what = f"rank {rank_} stopped on an error: {detail or 'see its log'}"
        if not what.endswith((".", "\n")):
            what += "."
    doing = ""
    for hook in _context_hooks:
        try:
            doing = hook() or doing
        except Exception:  # noqa: BLE001
            pass
    fail(f"tpu_dist: {what} {doing or 'This rank had no collective in flight.'}")
