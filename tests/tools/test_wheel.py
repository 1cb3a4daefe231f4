"""The distribution as a user installs it: build the wheel from a copy of the checkout,
install it into a fresh virtualenv in a temporary folder, and run the tools from a folder
that is not the checkout: `python -m torch_tpu bench --help` and the demo's smallest case.
Both houses come from the wheel (the runtime and the tools, with the entry points that join
them); nothing is read from, or written into, the checkout.

Two shortcuts keep this at about a minute, and neither changes what the wheel holds:
- the new venv sees the dependencies (torch, jax, transformers) of the development venv
  through a .pth line, which adds that folder to sys.path without running its own .pth
  files, so the editable install of torch_tpu there stays invisible;
- the C++ extension is the one `scripts/setup.sh` built from these very sources: setuptools
  lays out the packages (`build_py`, with their package data), the extension joins them,
  and `bdist_wheel --skip-build` packs that folder, where a full build would compile the
  extension again (torch's BuildExtension always rebuilds with ninja: ~2 min on 2 cores).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

import torch_tpu

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(cmd, cwd, timeout, env=None) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def _copy_checkout(dest: pathlib.Path) -> None:
    """The files git would commit (tracked, or new and not ignored), as they are now."""
    names = _run(["git", "ls-files", "-co", "--exclude-standard"], ROOT, 60).splitlines()
    for name in names:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _build_wheel(tree: pathlib.Path, dist: pathlib.Path) -> pathlib.Path:
    lib = tree / "build" / f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    _run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)], tree, 300)
    so = pathlib.Path(torch_tpu._C.__file__)
    shutil.copy(so, lib / "torch_tpu" / so.name)
    _run([sys.executable, "setup.py", "-q", "bdist_wheel", "--skip-build", "-d", str(dist)], tree, 300)
    wheel, = dist.glob("torch_tpu-*.whl")
    return wheel


@pytest.mark.slow  # builds a wheel and a virtualenv
def test_wheel_installs_and_runs_the_tools(tmp_path):
    tree, dist, venv, cwd = (tmp_path / n for n in ("src", "dist", "venv", "elsewhere"))
    cwd.mkdir()
    _copy_checkout(tree)
    wheel = _build_wheel(tree, dist)

    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 300)
    py = str(venv / "bin" / "python")
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd, 60).strip()
    (pathlib.Path(site) / "_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd, 300)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    where = _run([py, "-c", "import torch_tpu, torch_tpu_tools; print(torch_tpu.__file__); "
                  "print(torch_tpu_tools.__file__)"], cwd, 120, env)
    assert all(line.startswith(site) for line in where.split()), where  # the wheel's, not the checkout's
    assert "shapes" in _run([py, "-m", "torch_tpu", "bench", "--help"], cwd, 120, env)
    assert "rl" in _run([py, "-m", "torch_tpu", "bench", "--help"], cwd, 120, env)
    out = _run([py, "-m", "torch_tpu", "demo", "--steps", "2"], cwd, 600, env)
    assert "PASS" in out, out[-2000:]
    assert not list(cwd.iterdir()), "the demo wrote files into the current folder"
