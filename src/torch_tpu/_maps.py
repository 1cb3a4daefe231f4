"""The process's memory mappings against Linux's limit on them (vm.max_map_count).

Linux lets a process hold vm.max_map_count memory mappings (65,530 by default). An XLA:CPU
executable maps its JIT code in ~4-40 regions (a large fused graph's code is split into
many objects), and past the limit XLA cannot map the next program: its compile fails, and
the C++ exception that reports it crashed the process inside the unwinder (a DeferAndFuse
process running PyTorch's op tests died at ~1,700 programs and 58,000 mappings; a thread
that cannot map its stack would stop a computation for good). So before each program
compiles or loads, the program cache (_program_cache._bound_maps) may count the
mappings: past HIGH of the limit it holds fewer programs, enough to come back to LOW;
past REFUSE, where the mappings are the process's own, the compile raises MapLimitError,
which names the limit and how to raise it, and the process goes on.

Counting reads /proc/self/maps: 0.45 ms at 1,000 mappings, 3.6 ms at 5,000, 7.8 ms at
20,000, 44 ms at 60,000, where a small program compiles in ~20 ms. So it is done when due
(`due`): at the first program, then after as many first runs as the headroom allows at
twice the growth seen per first run (at least GROWTH), and whenever a second has passed
since the last count (what the process maps meanwhile: a data loader's shards). A burst
of the process's own mappings faster than that is not seen before XLA's failure.
"""
from __future__ import annotations

import time

HIGH, LOW, REFUSE = 0.5, 0.35, 0.97  # fractions of the limit (the module doc)
EACH = 8  # mappings a program is assumed to hold until measured
GROWTH = 128  # mappings one first run is assumed to add at most (a large graph: ~40)
EVERY_S = 1.0  # seconds after which a count is due anyway


def _limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux: no such limit to keep
        return None


LIMIT = _limit()
_base: list = []  # the mappings the process held besides its programs, at the first count
_due = {"runs": 0, "skip": 0, "at": None, "t": 0.0}  # since the last count; its value, time


class MapLimitError(RuntimeError):
    """The process is out of memory mappings: XLA could not map another program's code."""


def count() -> int:
    """The process's memory mappings now."""
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


def due() -> int | None:
    """At a first run: the mappings, counted now if a count is due (the module doc), else
    None (and None where there is no limit to keep)."""
    if LIMIT is None:
        return None
    _due["runs"] = runs = _due["runs"] + 1  # (threads compile too: no exact count needed)
    t = time.monotonic()
    if runs <= _due["skip"] and t - _due["t"] < EVERY_S:
        return None
    now, at = count(), _due["at"]
    seen = GROWTH if at is None else (now - at) / max(1, runs)
    _due.update(runs=0, at=now, t=t,
                skip=int(max(0.0, REFUSE * LIMIT - now) / (2 * max(GROWTH, seen))))
    return now


def programs_to_keep(now: int, held: int) -> int:
    """How many of the `held` programs to keep so that the mappings come down to LOW."""
    if not _base:
        _base.append(max(0, now - EACH * held))
    each = max(1.0, (now - _base[0]) / max(held, 1))
    return max(1, int(held - (now - LOW * LIMIT) / each))


def refuse_past_limit(now: int, what: str, held: int) -> None:
    if now > REFUSE * LIMIT:
        raise MapLimitError(
            f"torch_tpu: cannot compile {what}: this process holds {now} memory mappings, "
            f"and Linux allows it vm.max_map_count = {LIMIT}, so XLA could not map the "
            f"program's code. torch_tpu holds {held} programs, as few as it can; the "
            f"mappings are the process's own (memory-mapped files, many threads, large "
            f"allocations). Raise the limit (`sysctl -w vm.max_map_count=262144`) or "
            f"release some of them.")
