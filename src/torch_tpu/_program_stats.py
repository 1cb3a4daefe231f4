"""What the one program cache (_program_cache.py) holds and did: torch.tpu.compile_cache_stats()
and the run saved into the persistent cache folder when a process that held a program
ends, for `python -m torch_tpu report`."""
from __future__ import annotations

import atexit
import json
import os
import time

from . import _cache, _program_cache, _recompiles, metrics
from ._program_cache import ADMITTED, COMPILED, GRAPH, OP


def _requests(c):
    ops = sum(v for k, v in c.items() if k.startswith("dispatches."))
    return {OP: (ops, c.get("cache_misses", 0)),
            GRAPH: (c.get("fused_cache_hits", 0) + c.get("fused_graphs_compiled", 0),
                    c.get("fused_graphs_compiled", 0)),
            COMPILED: (c.get("compile.calls", 0), c.get("compile.executables", 0))}


def stats(programs: bool = True, disk: bool = True) -> dict:
    """torch.tpu.compile_cache_stats(): per kind of program (op: Strict's per-op
    executables and DeferAndFuse's recorded op entries; graph: fused graphs; compiled:
    torch.compile executables) the lookups, hits in memory, misses, hits in the persistent
    disk cache, XLA compiles, evictions, and the programs and bytes held now; with
    `programs`, every held program (name, where, reason, compile seconds, bytes); with
    `disk`, the persistent cache folder's size."""
    c = dict(metrics.counters)
    held = _program_cache.held()
    out = {"kinds": {}, "limits": _program_cache.limits(),
           "cache_only": _program_cache.is_cache_only(),
           "disk": disk_usage() if disk else None,
           "recompile_storms": c.get("programs.recompile_storms", 0)}
    for kind, (requests, misses) in _requests(c).items():
        out["kinds"][kind] = {
            "requests": requests, "memory_hits": max(requests - misses, 0), "misses": misses,
            "disk_hits": c.get(f"programs.{kind}.disk_hits", 0),
            "xla_compiles": c.get(f"programs.{kind}.xla_compiles", 0),
            "evictions": c.get(f"programs.{kind}.evictions", 0),
            "held": held[kind][0], "bytes": held[kind][1]}
    out["held"] = sum(h[0] for h in held.values())
    out["bytes"] = sum(h[1] for h in held.values())
    out["compile_seconds"] = metrics.compile_seconds[0]
    # torch.compiler.save/load_cache_artifacts (_cache.XlaArtifact): executables recorded
    # for saving, loaded from artifacts, and obtained from loaded ones instead of compiled
    out["artifacts"] = {"recorded": c.get("xla.artifacts_recorded", 0),
                        "loaded": c.get("xla.artifacts_loaded", 0),
                        "hits": c.get("xla.artifact_hits", 0)}
    out["recompile_reasons"] = list(metrics.recompile_reasons[-20:])
    out["storms"] = list(_recompiles.STORMS)
    if programs:
        out["programs"] = _program_cache.summaries()
    return out


def disk_usage() -> dict | None:
    """The persistent cache folder: its path, entries and bytes (None when it is off)."""
    folder = _cache.cache_dir()
    if folder is None:
        return None
    n = size = 0
    for f in folder.glob("*.xla"):
        try:
            size += f.stat().st_size
            n += 1
        except OSError:
            pass
    return {"dir": str(folder), "entries": n, "bytes": size}


RUNS_KEPT = 20
def save_run(folder=None) -> None:
    """Write this process's stats into the cache folder's `runs/` (the newest RUNS_KEPT
    are kept), for `python -m torch_tpu report`."""
    base = folder if folder is not None else _cache.cache_dir()
    if base is None:
        return
    runs = base / "runs"
    try:
        runs.mkdir(parents=True, exist_ok=True)
        data = stats(disk=False)  # (the report reads the folder itself)
        data["programs"] = sorted(data["programs"], key=lambda p: -p["compile_seconds"])[:200]
        data.update(pid=os.getpid(), time=time.time(), argv=list(__import__("sys").argv))
        path = runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
        path.write_text(json.dumps(data, default=str))
        for old in sorted(runs.glob("*.json"))[:-RUNS_KEPT]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a report is never worth an error at exit


@atexit.register
def _save_at_exit() -> None:
    if ADMITTED[0]:
        save_run()
