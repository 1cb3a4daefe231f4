"""`tpu_dist`: torch.distributed on JAX's multi-controller runtime.

One process per device; every process sees `tpu:0`. Launch with torchrun or
`torch.multiprocessing.spawn` exactly as for NCCL, with "tpu_dist" (or no backend at all:
it is the default for the tpu device):

    dist.init_process_group("tpu_dist")        # or dist.init_process_group()
    model = DDP(model.to("tpu"))

`init_process_group` rendezvouses through torch's store (env://, tcp://, file://, or
torchrun's), then starts JAX's distributed runtime with rank 0 as its coordinator (rank 0
picks a free port and publishes `host:port` in the store). Collectives are XLA collectives
across the processes (gloo on CPU, ICI on TPU), issued asynchronously; send and recv go
through host memory over a gloo connection per pair of ranks.

Several hosts: run torchrun on each host with the same `--nnodes`, `--master-addr` (a host
every node can reach) and `--master-port`, e.g.
    torchrun --nnodes=2 --node-rank=$I --nproc-per-node=4 --master-addr=10.0.0.1 \
             --master-port=29500 train.py
The coordinator listens on rank 0's address on the interface that routes to
MASTER_ADDR. Overrides: TORCH_TPU_DIST_HOSTNAME (this host's address, for the
coordinator and gloo), TORCH_TPU_COORDINATOR (a fixed `host:port` for the coordinator).

Failures, as NCCL's async error handling: a rank that dies (a SIGKILL, the OOM killer;
rank 0, JAX's coordinator, included), raises, hangs past the group timeout or issues a
mismatched collective ends every rank within about a second of the failure, each
printing one message that names the rank at fault (`_liveness.py`, `_watchdog.py`,
`_bootstrap.fail`). A failed or refused collective never hands its data out: the read
raises (or the process has ended) first.

The other TORCH_TPU_DIST_* settings (heartbeat, async error handling, the collective
check, the early start under torchrun) are declared in `torch_tpu/_config.py`;
`python -m torch_tpu settings` lists them all.
"""
from __future__ import annotations

import datetime

import torch.distributed as dist

from .. import _runtime, _waits
from . import _bootstrap
from .collectives import CollectiveMismatch
from .process_group import ProcessGroupTPU

BACKEND = "tpu_dist"
__all__ = ["BACKEND", "ProcessGroupTPU", "CollectiveMismatch", "register", "is_initialized"]

_registered = [False]


def is_initialized() -> bool:
    """Whether this process has joined JAX's distributed runtime (or runs alone)."""
    return _bootstrap.is_initialized()


def _timeout_s(timeout) -> float:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout) if timeout is not None else 1800.0


def _create(opts, backend_options=None) -> ProcessGroupTPU:
    """The creator torch calls for every new group on this backend."""
    timeout = _timeout_s(opts.timeout)
    _waits.at_least(timeout + 60)  # the group's watchdog names the rank at fault first
    ranks = list(opts.global_ranks_in_group or [])
    size = opts.group_size
    if not _bootstrap.is_initialized():
        if dist.is_initialized() and dist.get_world_size() != size:
            raise RuntimeError(
                "tpu_dist: the default process group must use the tpu_dist backend (or "
                "include the whole world) before tpu_dist subgroups are created")
        world = size
        _bootstrap.initialize(opts.store, opts.group_rank if not ranks else
                              ranks[opts.group_rank], world, timeout)
    if not ranks:
        ranks = list(range(size))
    return ProcessGroupTPU(opts.group_rank, size, ranks, timeout, str(opts.group_id or ""),
                           opts.store)


def register() -> None:
    """Register the backend (idempotent): `init_process_group("tpu_dist")`, and the
    default backend for the tpu device; functional collectives on tpu tensors; DTensor
    sharding for attention. (The stream API that FSDP2 expects on `torch.tpu` is
    torch_tpu/_streams.py's.)"""
    if _registered[0]:
        return
    _registered[0] = True
    if not dist.is_available():
        return
    if BACKEND.upper() not in dist.Backend._plugins:
        # `devices` must be a list: a string would be read character by character.
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu"])
    _runtime.before_backend(_bootstrap.before_backend)  # torchrun: join JAX's runtime early
    from . import _dtensor, _functional, _staged

    _functional.register()
    _staged.install()  # tpu tensors over gloo groups: c10d's ops staged through the host
    _dtensor.install()  # DTensor strategies for tpu's attention ops, once DTensor loads
register()
