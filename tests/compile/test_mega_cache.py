"""Shipping compiled programs through PyTorch's mega-cache, as a user does it: process A
compiles a function and an nn.Module training step with torch.compile(backend="tpu") and
saves `torch.compiler.save_cache_artifacts()` to a file; a fresh process B, with another,
empty TORCH_TPU_CACHE_DIR (or none), loads them and runs the same code, on inputs uploaded
from the host and made on the device, with no XLA compile at all (_cache.XlaArtifact,
docs/SHIPPING_PROGRAMS.md)."""
import json
import os
import subprocess
import sys
import textwrap
import zlib

import pytest
import torch

from torch_tpu import _cache

# A: save; B: load (or not), run, report. The last line of stdout is the JSON report.
_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import torch, torch_tpu
    from torch_tpu import metrics

    role, path = sys.argv[1], sys.argv[2]
    report = {"warnings": []}
    if role == "load":
        with open(path, "rb") as src, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            info = torch.compiler.load_cache_artifacts(src.read())
        report["warnings"] = [str(w.message) for w in caught]
        report["loaded"] = None if info is None else list(info.torch_tpu_xla_artifacts)

    def f(x, y, b):
        return torch.nn.functional.gelu(x @ y + b).sum(0) * 2 + 1

    def run(device, compiled):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 4)).to(device)
        x, y, t = (torch.randn(*s).to(device) for s in ((4, 8), (8, 8), (4, 4)))
        b = torch.linspace(0, 1, 8, device=device)  # made on the device
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        fn = torch.compile(f, backend="tpu") if compiled else f
        model = torch.compile(net, backend="tpu") if compiled else net
        out = {"f": fn(x, y, b).cpu().tolist(), "loss": []}
        for _ in range(2):
            loss = torch.nn.functional.mse_loss(model(x), t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out["loss"].append(loss.item())
        out["weight"] = net[0].weight.detach().cpu().flatten().tolist()
        return out

    report["tpu"] = run("tpu", True)
    torch.tpu.synchronize()
    c = metrics.as_dict()["counters"]
    report["xla_compiles"] = c.get("xla.compiles", 0)  # every executable, eager ops too
    for kind in ("compiled", "graph"):
        for what in ("xla_compiles", "disk_hits"):
            report[f"{kind}.{what}"] = c.get(f"programs.{kind}.{what}", 0)
    report["stats"] = torch.tpu.compile_cache_stats(programs=False)["artifacts"]
    if role == "save":
        data, info = torch.compiler.save_cache_artifacts()
        with open(path, "wb") as dst:
            dst.write(data)
        report["saved"] = list(info.torch_tpu_xla_artifacts)
        report["types"] = sorted(info.artifacts)
    report["cpu"] = run("cpu", False)
    print(json.dumps(report))
""")


def _run(role, artifacts, cache_dir, **env):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir), **env)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, role, str(artifacts)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same_as_cpu(report):
    for name in ("f", "loss", "weight"):
        torch.testing.assert_close(torch.tensor(report["tpu"][name]),
                                   torch.tensor(report["cpu"][name]), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Process A: its report and the artifacts file."""
    folder = tmp_path_factory.mktemp("mega_cache")
    path = folder / "artifacts.bin"
    report = _run("save", path, folder / "cache_a")
    return report, path


def test_save_holds_every_program(saved):
    a, path = saved
    # the function, the module's forward and its backward: one executable each
    assert a["compiled.xla_compiles"] == 3, a
    # and every other executable the process obtained (uploads, eager ops), once each
    assert len(a["saved"]) == len(set(a["saved"])) == a["xla_compiles"] > 3, a
    assert "torch_tpu_xla" in a["types"] and a["stats"]["recorded"] == len(a["saved"]), a
    assert path.stat().st_size > 0
    _same_as_cpu(a)


def test_load_runs_with_no_compile(saved, tmp_path):
    """B, with an empty cache folder of its own: every program comes from the artifacts,
    the compiled graphs' and those of the uploads and eager ops around them."""
    a, path = saved
    b = _run("load", path, tmp_path / "cache_b")
    assert b["loaded"] == a["saved"] and not b["warnings"], b
    assert b["xla_compiles"] == 0, b
    assert b["compiled.xla_compiles"] == 0 and b["compiled.disk_hits"] == 3, b
    n = len(a["saved"])
    assert b["stats"]["loaded"] == n and b["stats"]["hits"] == n, b
    assert b["tpu"] == a["tpu"]
    _same_as_cpu(b)


def test_without_loading_it_compiles(saved, tmp_path):
    a, _ = saved
    b = _run("run", "-", tmp_path / "cache_b")
    assert b["compiled.xla_compiles"] == 3 and b["stats"]["hits"] == 0, b
    assert b["tpu"] == a["tpu"]


@pytest.mark.slow
def test_load_with_the_disk_cache_off(saved):
    """TORCH_TPU_CACHE_DIR="": the loaded entries are held in memory, nothing is written."""
    a, path = saved
    b = _run("load", path, "")
    assert b["xla_compiles"] == 0 and b["stats"]["hits"] == len(a["saved"]), b
    assert b["tpu"] == a["tpu"]


@pytest.mark.slow
def test_corrupt_artifacts_compile_again(saved, tmp_path):
    """A damaged file fails torch's own checksum of the whole blob: nothing loads (torch
    logs it) and every program compiles. An artifact damaged under an intact blob (torch's
    CRC recomputed, as a tool that repacks artifacts would) fails ours: a warning, and
    that one program compiles."""
    a, path = saved
    data = bytearray(path.read_bytes())
    body = data.index(_cache._MAGIC) + len(_cache._MAGIC) + _cache._DIGEST
    data[body + 64] ^= 0xFF  # inside the first artifact's executable
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    b = _run("load", bad, tmp_path / "cache_b")
    assert b["loaded"] is None and b["xla_compiles"] == a["xla_compiles"], b
    assert b["tpu"] == a["tpu"]

    data[:4] = zlib.crc32(data[4:]).to_bytes(4, "big")  # torch's BytesWriter header
    bad.write_bytes(bytes(data))
    b = _run("load", bad, tmp_path / "cache_c")
    assert any("corrupt compiled-program artifact" in w for w in b["warnings"]), b
    n = len(a["saved"])  # the damaged one compiles, the others load
    assert b["xla_compiles"] == 1, b
    assert b["stats"]["loaded"] == n - 1 and b["stats"]["hits"] == n - 1, b
    assert b["tpu"] == a["tpu"]


@pytest.mark.slow
def test_defer_and_fuse_ships_its_fused_graphs(tmp_path):
    """DeferAndFuse fuses a compiled graph's call with the eager ops around it: those
    fused programs ship, and B obtains every one of them from the artifacts."""
    env = {"TORCH_TPU_DEFER_AND_FUSE": "1"}
    path = tmp_path / "artifacts.bin"
    a = _run("save", path, tmp_path / "cache_a", **env)
    assert a["saved"] and a["stats"]["recorded"] == len(a["saved"]), a
    b = _run("load", path, tmp_path / "cache_b", **env)
    assert b["stats"]["hits"] == len(a["saved"]) and not b["warnings"], b
    assert b["xla_compiles"] == 0, b
    assert b["tpu"] == a["tpu"]
    _same_as_cpu(b)
