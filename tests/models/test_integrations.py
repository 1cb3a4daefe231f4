"""The accelerate adapter (torch_tpu/_integrations/accelerate.py): applied lazily, only where
accelerate found no device of its own, and still matching the accelerate it was written for.
tests/models/test_trainer.py runs HF Trainer through it end to end."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch

import accelerate  # noqa: E402  (pinned in requirements-dev.txt)
from accelerate.state import PartialState  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

from torch_tpu._integrations import accelerate as adapter  # noqa: E402

from helpers.dist_launch import SRC  # noqa: E402


@pytest.mark.parametrize("patch", adapter.PATCHES, ids=lambda p: p.target)
def test_written_against_this_accelerate(patch):
    """A new accelerate must be read against the wrappers before the pin moves: they call
    through these members and rely on what each returns when it finds no device."""
    assert accelerate.__version__ == adapter.WRITTEN_AGAINST, (
        f"accelerate {accelerate.__version__}: re-check torch_tpu/_integrations/accelerate.py "
        f"(written against {adapter.WRITTEN_AGAINST}), then update WRITTEN_AGAINST")
    owner, name = patch.owner_and_name()
    assert inspect.getattr_static(owner, name)._tpu_patch is patch
    assert patch.current_signature() == patch.signature, (
        f"accelerate changed {patch.target}: was {patch.signature}, "
        f"now {patch.current_signature()}")


@pytest.mark.slow  # a fresh process: torch_tpu, then accelerate
def test_patched_only_when_accelerate_is_imported():
    code = ("import sys, torch_tpu; assert 'accelerate' not in sys.modules, 'imported early';"
            "from accelerate.state import PartialState;"
            "assert PartialState.set_device._tpu_patch;"
            "print(PartialState().device)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCAL_RANK", None)
    env.pop("ACCELERATE_TORCH_DEVICE", None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.split()[-1] == "tpu"


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    PartialState._reset_state()
    yield
    PartialState._reset_state()


def test_single_process_device(fresh_state, monkeypatch):
    assert PartialState().device == torch.device("tpu")
    assert PartialState().distributed_type == DistributedType.NO
    PartialState._reset_state()
    assert PartialState(cpu=True).device == torch.device("cpu")  # use_cpu=True still means CPU
    PartialState._reset_state()
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")  # an explicit choice wins
    assert PartialState().device == torch.device("cpu")


def test_backend_under_torchrun(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    state = object.__new__(PartialState)  # _prepare_backend reads only its arguments
    assert state._prepare_backend() == ("tpu_dist", DistributedType.MULTI_GPU)
    assert state._prepare_backend(backend="gloo") == ("gloo", DistributedType.MULTI_GPU)
    assert state._prepare_backend(cpu=True) == ("gloo", DistributedType.MULTI_CPU)
    monkeypatch.delenv("LOCAL_RANK")
    assert state._prepare_backend() == (None, DistributedType.NO)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_set_device_for_a_launched_process(local_rank):
    state = object.__new__(PartialState)
    state.__dict__.update(device=None, distributed_type=DistributedType.MULTI_GPU, _cpu=False,
                          local_process_index=local_rank)
    state.set_device()
    # accelerate's generic rule for its other devices: local rank modulo the local count
    assert state.device == torch.device("tpu", local_rank % torch.tpu.device_count())
