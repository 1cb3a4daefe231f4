"""Counters and the report: dispatches, compiles, cache hits, CPU fallbacks.

Counters are plain dict increments on the hot path; the report is built on demand.
"""
from __future__ import annotations

import collections

counters: collections.Counter = collections.Counter()
fallback_ops: collections.Counter = collections.Counter()
compile_seconds = [0.0]
recompile_reasons: list = []   # why each fused graph compiled again (DeferAndFuse)


def count(name: str, n: int = 1) -> None:
    counters[name] += n


def reset() -> None:
    counters.clear()
    fallback_ops.clear()
    compile_seconds[0] = 0.0
    recompile_reasons.clear()


def as_dict() -> dict:
    c = dict(counters)
    # hits are derived, so the hot path counts one thing per op
    dispatched = sum(v for k, v in c.items() if k.startswith("dispatches."))
    c["cache_hits"] = dispatched - c.get("cache_misses", 0)
    return {
        "counters": c,
        "compile_seconds": compile_seconds[0],
        "cpu_fallbacks": dict(fallback_ops),
        "recompile_reasons": list(recompile_reasons),
    }


def report() -> str:
    d = as_dict()
    lines = ["torch_tpu metrics"]
    for k in sorted(d["counters"]):
        lines.append(f"  {k:32s} {d['counters'][k]}")
    lines.append(f"  {'compile_seconds':32s} {d['compile_seconds']:.3f}")
    if d["cpu_fallbacks"]:
        lines.append("  CPU fallbacks by op:")
        for op, n in sorted(d["cpu_fallbacks"].items()):
            lines.append(f"    {op:40s} {n}")
    if d["recompile_reasons"]:
        lines.append("  fused-graph recompiles:")
        lines.extend(f"    {r}" for r in d["recompile_reasons"][-20:])
    return "\n".join(lines)


def print_at_exit() -> None:
    """TORCH_TPU_METRICS=1: print the report when the process ends."""
    import atexit

    atexit.register(lambda: print(report()))
