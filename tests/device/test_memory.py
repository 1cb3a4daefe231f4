"""Device memory as CUDA reports it: a capacity, torch.OutOfMemoryError at the call past
it, a process that goes on after freeing, and counters that agree (src/torch_tpu/_memory.py).

Each case is a user script run in its own process with a small budget
(TORCH_TPU_MEMORY_LIMIT=256MiB), in Strict and in DeferAndFuse, so nothing here really
takes gigabytes; the 4 TiB request never reaches XLA.
"""
import pytest
import torch
from helpers.user_script import run_script

from torch_tpu import _config, _runtime

MODES = ["strict", "defer_and_fuse"]
MiB = 2**20
_USER_LINE = """
def user_line(error):  # the script's own line in the error's traceback, and its number
    mine = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == __file__]
    return mine[-1].line, mine[-1].lineno
"""


def run(body: str, mode: str = "strict", limit: str | None = "256MiB", timeout=240) -> dict:
    """Run `body` as a script in a fresh process in eager `mode`; it reports by assigning
    to the dict `out`, which comes back."""
    return run_script(body, mode, prelude=_USER_LINE, limit=limit, timeout=timeout)


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_raises_at_the_call_and_the_process_goes_on(mode):
    """A factory past the capacity, and an op whose result is: the error comes where the
    size is known (before XLA runs the op in Strict, while recording in DeferAndFuse),
    names the request, the use and the capacity in CUDA's words and the user's line, and
    what was recorded before it still runs."""
    out = run("""
        x = torch.ones(1000, device="tpu")
        before = torch.tpu.memory_reserved()
        try:
            y = torch.empty(1 << 40, device="tpu")  # 4 TiB of float32
        except torch.OutOfMemoryError as e:
            out["message"] = str(e)
            out["line"], out["lineno"] = user_line(e)
            out["is_cuda_class"] = isinstance(e, torch.cuda.OutOfMemoryError)
        out["reserved_same"] = torch.tpu.memory_reserved() == before
        out["after"] = (x * 2).sum().item()

        a = torch.ones(16 * 2**20, device="tpu")  # 64 MiB
        b = a + 1
        try:
            big = torch.cat([a, a, a, a])  # 256 MiB more
        except torch.OutOfMemoryError as e:
            out["op_message"] = str(e)
            out["op_line"] = user_line(e)[0]
        out["b"] = b[:3].tolist()
        out["allocated"] = torch.tpu.memory_allocated()
        out["num_ooms"] = torch.tpu.memory_stats()["num_ooms"]
    """, mode)
    msg = out["message"]
    assert msg.startswith("tpu out of memory. Tried to allocate 4096.00 GiB (tpu:0; "), msg
    assert "256.00 MiB total capacity; " in msg and " already allocated" in msg, msg
    assert "; 256.00 MiB free) at " in msg, msg
    assert f"user_script.py:{out['lineno']}. To go on" in msg, msg
    assert "TORCH_TPU_MEMORY_LIMIT" in msg and "gc.collect()" in msg, msg
    if mode == "defer_and_fuse":  # torch.ones(1000) has not run yet
        assert "3.91 KiB already allocated, 3.91 KiB of it by DeferAndFuse results not yet run" in msg
    assert out["line"] == 'y = torch.empty(1 << 40, device="tpu")  # 4 TiB of float32'
    assert out["is_cuda_class"] and out["reserved_same"] and out["after"] == 2000.0

    assert "Tried to allocate 256.00 MiB" in out["op_message"]
    assert out["op_line"] == "big = torch.cat([a, a, a, a])  # 256 MiB more"
    assert out["b"] == [2.0, 2.0, 2.0] and out["allocated"] == 128 * MiB + 4000
    assert out["num_ooms"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_allocate_until_it_fails_free_and_go_on(mode):
    """CUDA's recovery idiom: the loop stops at the capacity with an error, frees, and runs
    again; the figures (how many, how fast the error comes) are in docs/RELIABILITY.md."""
    out = run("""
        def fill():
            kept = []
            for i in range(100):  # 30 MiB each: the 256 MiB budget holds 8
                try:
                    kept.append(torch.ones(30 * 2**18, device="tpu"))
                except torch.OutOfMemoryError as e:
                    t0 = time.perf_counter()
                    try:
                        torch.ones(30 * 2**18, device="tpu")
                    except torch.OutOfMemoryError:
                        out.setdefault("raise_s", time.perf_counter() - t0)
                    out.setdefault("message", str(e))
                    return kept
            return kept
        first = fill()
        out["first"] = len(first)
        out["total"] = sum(t.sum().item() for t in first)
        out["reserved_full"] = torch.tpu.memory_reserved()
        del first
        gc.collect()
        out["reserved_freed"] = torch.tpu.memory_reserved()
        second = fill()
        out["second"] = len(second)
        out["total2"] = sum(t.sum().item() for t in second)
    """, mode)
    assert out["first"] == out["second"] == 8, out
    assert out["total"] == out["total2"] == 8 * 30 * 2**18
    assert out["reserved_full"] == 240 * MiB and out["reserved_freed"] == 0, out
    assert "Tried to allocate 30.00 MiB" in out["message"] and "240.00 MiB already" in out["message"]
    assert out["raise_s"] < 0.1


@pytest.mark.parametrize("mode", MODES)
def test_the_counters_agree_and_the_fraction_limits(mode):
    out = run("""
        props = torch.tpu.get_device_properties()
        x = torch.ones(2**20, device="tpu")  # 4 MiB
        y = x * 3  # pending in DeferAndFuse: reserved, not yet allocated
        out["pending"] = [torch.tpu.memory_allocated(), torch.tpu.memory_reserved()]
        torch.tpu.synchronize()
        stats = torch.tpu.memory_stats()
        out["total"] = props.total_memory
        out["info"] = list(torch.tpu.mem_get_info())
        out["acc_info"] = list(torch.accelerator.get_memory_info())
        out["tpu"] = [torch.tpu.memory_allocated(), torch.tpu.memory_reserved(),
                      torch.tpu.max_memory_allocated(), torch.tpu.max_memory_reserved()]
        out["acc"] = [torch.accelerator.memory_allocated(), torch.accelerator.memory_reserved(),
                      torch.accelerator.max_memory_allocated(),
                      torch.accelerator.max_memory_reserved()]
        out["stats"] = [stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"],
                        stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]]
        out["count"] = stats["allocation.all.current"]
        del x, y
        out["freed"] = [torch.tpu.memory_allocated(), torch.tpu.memory_reserved()]
        torch.tpu.reset_peak_memory_stats()
        out["peak_reset"] = torch.tpu.max_memory_allocated()

        torch.tpu.set_per_process_memory_fraction(0.5)
        out["fraction"] = torch.tpu.get_per_process_memory_fraction()
        a = torch.ones(24 * 2**20, device="tpu")  # 96 MiB of the 128 allowed
        try:
            b = torch.ones(16 * 2**20, device="tpu")  # 64 MiB more
        except torch.OutOfMemoryError as e:
            out["message"] = str(e)
        torch.tpu.set_per_process_memory_fraction(1.0)
        b = torch.ones(16 * 2**20, device="tpu")
        out["ok"] = (a.sum() + b.sum()).item()
        for bad in (1.5, -0.1, 1):
            try:
                torch.tpu.set_per_process_memory_fraction(bad)
            except (TypeError, ValueError) as e:
                out.setdefault("refused", []).append(type(e).__name__)
        out["total_after"] = torch.tpu.get_device_properties().total_memory
    """, mode)
    four = 4 * MiB
    assert out["total"] == out["total_after"] == 256 * MiB
    if mode == "defer_and_fuse":
        assert out["pending"] == [0, 2 * four], out  # torch.ones is pending too
    else:
        assert out["pending"] == [2 * four, 2 * four]
    assert out["tpu"] == out["acc"] == out["stats"] == [2 * four] * 4, out
    assert out["info"] == out["acc_info"] == [256 * MiB - 2 * four, 256 * MiB]
    assert out["count"] == 2 and out["freed"] == [0, 0] and out["peak_reset"] == 0

    assert out["fraction"] == 0.5
    assert "128.00 MiB allowed by set_per_process_memory_fraction" in out["message"]
    assert "32.00 MiB free" in out["message"]
    assert out["ok"] == 40 * 2**20 and out["refused"] == ["ValueError", "ValueError", "TypeError"]


@pytest.mark.parametrize("mode", MODES)
def test_xla_resource_exhausted_becomes_out_of_memory(mode):
    """A budget far above what the host has lets a request reach XLA, which cannot allocate 4
    TiB (RESOURCE_EXHAUSTED): the same torch.OutOfMemoryError, and the process goes on."""
    out = run("""
        x = torch.empty(1 << 40, device="tpu")  # within the budget: no buffer yet
        try:
            (x + 1).sum().item()
        except torch.OutOfMemoryError as e:
            out["message"] = str(e)
            out["cause"] = type(e.__cause__).__name__
        del x
        gc.collect()  # (the failed DeferAndFuse graph's nodes and storages form cycles)
        out["after"] = torch.ones(3, device="tpu").sum().item()
    """, mode, limit="64TiB")
    assert out["message"].startswith("tpu out of memory. Tried to allocate 4096.00 GiB"), out
    assert ": RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 bytes." in out["message"]
    assert out["cause"] == "JaxRuntimeError"
    assert out["after"] == 3.0


def test_default_capacity_on_xla_cpu_is_half_the_host():
    out = run("""
        from torch_tpu import _memory, _runtime
        out["started_by_import"] = _runtime.started()
        x = torch.empty(0, device="tpu")  # as on CUDA, the first tpu tensor starts the device
        out["started"] = _runtime.started()
        out["total"] = torch.tpu.get_device_properties().total_memory
        out["info"] = list(torch.tpu.mem_get_info())
        out["expected"] = _memory.host_memory() // 2
    """, limit=None)
    assert not out["started_by_import"] and out["started"]
    assert out["total"] == out["expected"] == out["info"][1] > 0


def test_memory_limit_setting_parses_sizes(monkeypatch):
    setting = _config.SETTINGS["TORCH_TPU_MEMORY_LIMIT"]
    assert setting.parse(None) is None and setting.parse(" ") is None
    assert setting.parse("268435456") == 256 * MiB
    assert setting.parse("256MiB") == setting.parse("256 mib") == 256 * MiB
    assert setting.parse("1.5GiB") == 3 * 2**29 and setting.parse("8GB") == 8 * 10**9
    assert setting.parse("2TiB") == 2**41 and setting.parse("100B") == 100
    for bad in ("lots", "8 gigs", "-1GiB", "8M", "inf", "nan GiB"):
        with pytest.raises(ValueError, match="TORCH_TPU_MEMORY_LIMIT=.*expected a size"):
            setting.parse(bad)
    monkeypatch.setenv("TORCH_TPU_MEMORY_LIMIT", "1KiB")
    assert _config.get("TORCH_TPU_MEMORY_LIMIT") == 1024


def test_resource_exhausted_in_the_allocators_words():
    torch.tpu.mem_get_info()  # (the capacity is known once the device has started)

    class FakeXlaError(Exception):
        pass

    err = FakeXlaError("RESOURCE_EXHAUSTED: Out of memory allocating 3221225472 bytes.\nmore")
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 3.00 GiB .*XLA, "
                       r"running g: RESOURCE_EXHAUSTED: Out of memory allocating 3221225472 "
                       r"bytes\. To go on") as info:
        _runtime.raise_if_out_of_memory(err, "running g")
    assert info.value.__cause__ is err
    _runtime.raise_if_out_of_memory(FakeXlaError("INTERNAL: something else"))  # returns
