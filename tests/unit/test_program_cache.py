"""The program caches are bounded: Strict's op executables, DeferAndFuse's fused graphs
and torch.compile's executables share one LRU, by count and bytes; what falls out is
counted (`programs.<kind>.evictions`) and its memory is given back.

The figures (test_500_sizes_of_one_op_keep_memory_bounded): on XLA:CPU each held program
costs ~0.3 MB of resident memory once jax's cached lowering of it is dropped
(_jax_internals.forget_lowerings; 1.5 MB with it). The stated bound: at most 0.5 MB per
held program, so the default cap (4,096 programs, 2 GB by the caches' own count) holds
at most ~2 GB, which a 24 GiB machine never reaches; past a cap, what leaves is counted
and its memory given back.
"""
import pytest
import torch
from helpers.dist_launch import run_script

import torch_tpu
from torch_tpu import _program_cache, metrics
from torch_tpu.eager import fuse


def _evictions():
    return sum(v for k, v in metrics.counters.items() if k.endswith(".evictions"))


@pytest.fixture
def bound():
    """Bound the caches to a few programs for one test (what earlier tests compiled
    leaves at once: they compile again if they run again)."""
    old = _program_cache.limits()

    def set_bound(n):
        _program_cache.set_limits(programs=n)
        return n

    yield set_bound
    _program_cache.set_limits(**old)


def test_past_the_bound_the_least_recently_used_programs_go(eager, bound):
    base = torch.arange(600, dtype=torch.float32, device="tpu")
    torch_tpu.sync()
    hot = base[:3] * 7
    hot.cpu()
    limit = bound(6)
    evicted = _evictions()  # (since set_limits: this test's own evictions)
    for n in range(40, 60):
        assert torch.equal((base[:n] * 7).cpu(), torch.arange(n, dtype=torch.float32) * 7)
        hot = (base[:3] * 7).cpu()  # used every step: never the least recently used
    s = torch.tpu.compile_cache_stats()
    assert s["held"] <= limit and _evictions() - evicted >= 14, (s["held"], limit)
    # the hot program survived; an evicted size compiles again, and is right
    misses, graphs = metrics.counters["cache_misses"], metrics.counters["fused_graphs_compiled"]
    (base[:3] * 7).cpu()
    assert (metrics.counters["cache_misses"], metrics.counters["fused_graphs_compiled"]) == \
        (misses, graphs)
    assert torch.equal((base[:40] * 7).cpu(), torch.arange(40, dtype=torch.float32) * 7)
    grew = (metrics.counters["cache_misses"] - misses
            if eager == "strict" else metrics.counters["fused_graphs_compiled"] - graphs)
    assert grew == 1
    if eager == "defer":  # a cached graph's op entries are never evicted before it
        for cache in (fuse._CACHE, fuse._CACHE_UNCHECKED):
            for rec, entries, _ in cache.values():
                for p in rec.pins:
                    assert p.owner.get(p.key) in entries, p.name


def test_compiled_graphs_of_many_sizes_are_bounded_too(bound):
    f = torch.compile(lambda a: (a * 3).cos(), backend="tpu", dynamic=True)
    f(torch.ones(3, device="tpu"))
    limit = bound(4)
    before = _evictions()
    for n in range(61, 71):  # one graph; a program per size (XLA's shapes are static)
        x = torch.full((n,), 0.5, device="tpu")
        torch.testing.assert_close(f(x).cpu(), (torch.full((n,), 0.5) * 3).cos())
    s = torch.tpu.compile_cache_stats(False)
    assert _evictions() - before >= 7 and s["held"] <= limit, s
    assert s["kinds"]["compiled"]["held"] <= limit


SIZES = r'''
import ctypes, gc, json, sys
import torch, torch_tpu

libc = ctypes.CDLL("libc.so.6")


def rss_mb():
    gc.collect()
    libc.malloc_trim(0)  # freed memory back to the system, so RSS shows what is held
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


torch_tpu.set_eager_mode(sys.argv[1])
base = torch.arange(1024, dtype=torch.float32, device="tpu")
marks, held = {}, {}


def sizes(first, last):
    for n in range(first, last + 1):
        y = (base[:n] * 2).cpu()
        assert torch.equal(y, torch.arange(n, dtype=torch.float32) * 2)
        if n % 100 == 0:
            marks[n] = rss_mb()
            held[n] = torch.tpu.compile_cache_stats(programs=False, disk=False)["held"]


default_limits = torch.tpu.compile_cache_stats(programs=False, disk=False)["limits"]
sizes(1, 500)  # under the default cap: every program stays
from torch_tpu import _program_cache
_program_cache.set_limits(programs=64)  # a cap that bites: the oldest programs go
sizes(501, 600)
s = torch.tpu.compile_cache_stats(programs=False)
print("RESULT " + json.dumps({"rank": 0, "rss": marks, "held": held, "kinds": s["kinds"],
                              "limits": s["limits"], "default_limits": default_limits}))
'''


@pytest.mark.slow  # 500 compiles in a fresh process, per mode
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_500_sizes_of_one_op_keep_memory_bounded(mode, tmp_path):
    script = tmp_path / "sizes.py"
    script.write_text(SIZES.replace("sys.argv[1]", repr(mode)))
    code, out, results = run_script(
        script, env={"TORCH_TPU_CACHE_DIR": "0", "TORCH_TPU_RECOMPILE_WARN": "0"}, timeout=900)
    assert code == 0 and results, out[-4000:]
    r = results[0]
    rss, held = r["rss"], r["held"]
    kind = "op" if mode == "strict" else "graph"
    # the default cap: every size's program kept, each costing at most 0.5 MB
    assert held["500"] - held["100"] >= 400 and r["kinds"][kind]["misses"] >= 600, r
    per_program = (rss["500"] - rss["100"]) / (held["500"] - held["100"])
    assert per_program <= 0.5, f"{per_program:.2f} MB per held program (bound 0.5): {r}"
    assert r["default_limits"]["programs"] * 0.5 <= 2048 and r["default_limits"]["mb"] <= 2048, r
    # a cap of 64: the rest leave, counted, and their memory goes back
    assert held["600"] <= 64 and r["limits"]["programs"] == 64, r
    assert r["kinds"][kind]["evictions"] >= 500, r
    assert rss["600"] < rss["500"] - 100 * per_program, r
