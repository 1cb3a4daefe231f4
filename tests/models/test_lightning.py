"""PyTorch Lightning on tpu, unmodified: Trainer and Fabric, one process and DDP, fp32 and bf16.

`trainer_script` and `fabric_script` below are what a user writes: a small regression MLP,
a fixed seed, two short epochs. Each run is a subprocess that does not import this package
(torch loads it through its device-backend autoload), once with accelerator "auto" or
"tpu", and once with accelerator "cpu" in the same environment; the losses and the trained
weights must agree (1e-5 in fp32, looser in bf16). Each run records, from inside the step,
the device of the batch and of the parameters and the dtype the first layer computed in,
which the tests check. DDP with devices=2 runs as users run it: `python script.py`, whose
Trainer (or `Fabric.launch()`) starts the other rank by re-running the script (Lightning's
subprocess launcher), and under torchrun.

The adapter under test is torch_tpu/_integrations/lightning.py (docs/LIGHTNING.md); the
fast tests below check its choices in this process and its patches against the pinned
Lightning (requirements-dev.txt).
"""
from __future__ import annotations

import functools
import inspect
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
EPOCHS, SAMPLES, BATCH = 2, 48, 8
FP32_TOLERANCE, BF16_TOLERANCE = 1e-5, 2e-2
TIMEOUT = 300  # s, per run (a run takes ~15-40 s on 2 loaded cores)


# ---------------------------------------------------------------- the user's scripts
def _data_and_model(seed_everything):
    import torch
    from torch import nn

    seed_everything(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    seen = {}

    def record(module, args, out):  # where the first layer ran, and in which dtype
        seen.update(devices=sorted({str(args[0].device), str(module.weight.device)}),
                    compute_dtype=str(out.dtype).replace("torch.", ""))
    net[0].register_forward_hook(record)
    return data, net, seen


def trainer_script(out_dir, package, accelerator, devices, precision):
    import torch
    import torch.nn.functional as F

    L = __import__("lightning.pytorch" if package == "lightning" else "pytorch_lightning",
                   fromlist=["LightningModule"])

    class Regressor(L.LightningModule):
        def __init__(self, net=None):
            super().__init__()
            self.net = net
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.net(x).float(), y)
            self.log("train_loss", loss)
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.losses.append(outputs["loss"].item())

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.mse_loss(self.net(x).float(), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

        def on_train_end(self):  # in each process that trained
            trainer = self.trainer
            result = {
                "losses": self.losses, "val_loss": trainer.callback_metrics["val_loss"].item(),
                "weights": [p.double().sum().item() for p in self.parameters()], **seen,
                "accelerator": type(trainer.accelerator).__name__,
                "strategy": type(trainer.strategy).__name__, "world_size": trainer.world_size,
                "autocast": getattr(trainer.precision_plugin, "device", None)}
            if trainer.world_size == 1:  # the checkpoint Lightning saved holds these weights
                state = torch.load(trainer.checkpoint_callback.best_model_path, map_location="cpu")
                result["checkpoint_diff"] = max(
                    (state["state_dict"][k].float() - v.float().cpu()).abs().max().item()
                    for k, v in self.state_dict().items())
            with open(os.path.join(out_dir, f"result{trainer.global_rank}.json"), "w") as f:
                json.dump(result, f)

    data, net, seen = _data_and_model(L.seed_everything)
    trainer = L.Trainer(accelerator=accelerator, devices=devices, precision=precision,
                        max_epochs=EPOCHS, default_root_dir=out_dir, enable_progress_bar=False)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    trainer.fit(Regressor(net), loader, loader)


def fabric_script(out_dir, package, accelerator, devices, precision):
    import torch
    import torch.nn.functional as F

    Fabric = __import__("lightning.fabric" if package == "lightning" else "lightning_fabric",
                        fromlist=["Fabric"]).Fabric
    fabric = Fabric(accelerator=accelerator, devices=devices, precision=precision)
    fabric.launch()
    data, net, seen = _data_and_model(fabric.seed_everything)
    model, optimizer = fabric.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=BATCH))
    losses = []
    for _ in range(EPOCHS):
        for x, y in loader:
            loss = F.mse_loss(model(x).float(), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    mean = fabric.all_reduce(torch.tensor(sum(losses), device=fabric.device), reduce_op="mean")
    result = {"losses": losses, "val_loss": mean.item() / len(losses),
              "weights": [p.double().sum().item() for p in model.parameters()], **seen,
              "accelerator": type(fabric.accelerator).__name__,
              "strategy": type(fabric.strategy).__name__, "world_size": fabric.world_size,
              "autocast": getattr(fabric.strategy.precision, "device", None)}
    with open(os.path.join(out_dir, f"result{fabric.global_rank}.json"), "w") as f:
        json.dump(result, f)


# ---------------------------------------------------------------- running them
class RunFailed(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)  # a CPU run serves every test it is the reference of
def run(script: str, accelerator: str, *, devices: int = 1, precision: str = "32-true",
        package: str = "pytorch_lightning", torchrun: bool = False) -> tuple:
    """The user's script as `python test_lightning.py ...` (under torchrun when asked);
    one result per process."""
    out_dir = tempfile.mkdtemp(prefix="lightning_")
    cmd = [sys.executable, __file__, script, out_dir, package, accelerator, str(devices), precision]
    if torchrun:
        from helpers.dist_launch import free_port

        cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc-per-node={devices}",
                    "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCH_TPU_", "PL_", "LT_")) and k not in
           ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([SRC, env.get("PYTHONPATH", "")]))
    # a new session, so that a timeout also ends the rank Lightning started
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        output, _ = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        output, _ = p.communicate()
        raise RunFailed(f"{cmd} ran past {TIMEOUT} s:\n{output[-6000:]}") from None
    if p.returncode != 0:
        raise RunFailed(f"{cmd} failed (exit {p.returncode}):\n{output[-8000:]}")
    results = []
    for rank in range(devices):
        with open(os.path.join(out_dir, f"result{rank}.json")) as f:
            results.append(json.load(f))
    return tuple(results)


def check_against_cpu(got, want, *, tolerance=FP32_TOLERANCE, by_rank=False, compute="float32"):
    assert len(got) == len(want)
    for r, (g, w) in enumerate(zip(got, want)):
        device = f"tpu:{r}" if by_rank else "tpu:0"
        assert g["accelerator"] == "TPUAccelerator" and w["accelerator"] == "CPUAccelerator", (g, w)
        assert g["devices"] == [device] and w["devices"] == ["cpu"], (r, g["devices"], w["devices"])
        assert g["compute_dtype"] == w["compute_dtype"] == compute, (g, w)
        assert g["world_size"] == w["world_size"] == len(got)
        strategy = "DDPStrategy" if len(got) > 1 else "SingleDeviceStrategy"
        assert g["strategy"] == w["strategy"] == strategy, (g, w)
        assert len(g["losses"]) == len(w["losses"]) == EPOCHS * SAMPLES // BATCH // len(got)
        assert all(math.isfinite(x) for x in g["losses"])
        diff = max(abs(a - b) for a, b in zip(g["losses"] + [g["val_loss"]],
                                              w["losses"] + [w["val_loss"]]))
        assert diff < tolerance, (r, diff, g["losses"], w["losses"])
        diff = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(g["weights"], w["weights"]))
        assert diff < tolerance, (r, diff, g["weights"], w["weights"])
        # DDP: every rank ends with the same weights (the gradients were all-reduced)
        assert max(abs(a - b) for a, b in zip(g["weights"], got[0]["weights"])) < 1e-6


# ---------------------------------------------------------------- fast: choices and patches
def _lightning():
    import lightning.fabric
    import lightning.pytorch
    import lightning_fabric
    import pytorch_lightning

    return {"pytorch_lightning": pytorch_lightning, "lightning_fabric": lightning_fabric,
            "lightning.pytorch": lightning.pytorch, "lightning.fabric": lightning.fabric}


def test_written_against_this_lightning():
    """A new Lightning must be read against the wrappers before the pin moves."""
    from torch_tpu._integrations import lightning as adapter

    for name, module in _lightning().items():
        assert module.__version__ == adapter.WRITTEN_AGAINST, (
            f"{name} {module.__version__}: re-check torch_tpu/_integrations/lightning.py "
            f"(written against {adapter.WRITTEN_AGAINST}), then update WRITTEN_AGAINST")
    for patches in adapter.PATCHES.values():
        for patch in patches:
            owner, name = patch.owner_and_name()
            assert getattr(getattr(owner, name), "_tpu_patch", None) is patch, patch.target
            assert patch.current_signature() == patch.signature, (
                f"Lightning changed {patch.target}: was {patch.signature}, "
                f"now {patch.current_signature()}")


@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning.pytorch"])
def test_trainer_choices(package):
    """What Trainer picks, without training: in both layouts, "auto" and "tpu" are this
    package's device, "cpu" stays the CPU, mixed precision autocasts on tpu, and several
    devices are DDP over tpu_dist."""
    import torch

    L = _lightning()[package]
    kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    for accelerator in ("auto", "tpu"):
        trainer = L.Trainer(accelerator=accelerator, **kw)
        assert type(trainer.accelerator).__name__ == "TPUAccelerator"
        assert isinstance(trainer.accelerator, L.accelerators.Accelerator)
        assert trainer.strategy.root_device == torch.device("tpu", 0)
        assert type(pickle.loads(pickle.dumps(trainer.accelerator))) is type(trainer.accelerator)
    assert type(L.Trainer(accelerator="cpu", **kw).accelerator).__name__ == "CPUAccelerator"
    for precision in ("bf16-mixed", "16-mixed"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plugin = L.Trainer(precision=precision, **kw).precision_plugin
        assert plugin.device == "tpu", precision
        assert (plugin.scaler is None) == (precision == "bf16-mixed")
        assert plugin.scaler is None or plugin.scaler._device == "tpu"
        assert not [w for w in caught if "CUDA" in str(w.message)], caught
    strategy = L.Trainer(devices=2, **kw).strategy
    assert type(strategy).__name__ == "DDPStrategy"
    assert strategy.parallel_devices == [torch.device("tpu", 0)] * 2  # one process each
    assert strategy._get_process_group_backend() == "tpu_dist"
    assert strategy.determine_ddp_device_ids() is None


@pytest.mark.parametrize("package", ["lightning_fabric", "lightning.fabric"])
def test_fabric_choices(package):
    import torch

    Fabric = _lightning()[package].Fabric
    for accelerator in ("auto", "tpu"):
        fabric = Fabric(accelerator=accelerator)
        assert type(fabric.accelerator).__name__ == "TPUAccelerator"
        assert fabric.device == torch.device("tpu", 0)
    assert Fabric(accelerator="cpu").device == torch.device("cpu")
    assert Fabric(precision="bf16-mixed").strategy.precision.device == "tpu"
    assert Fabric(devices=2).strategy._get_process_group_backend() == "tpu_dist"
    with pytest.raises(ValueError, match="number of processes"):
        Fabric(accelerator="tpu", devices=[0, 1])


def test_adapted_only_when_lightning_is_imported():
    from helpers.dist_launch import SRC as src

    code = ("import sys, torch, torch_tpu;"
            "early = [m for m in sys.modules if 'lightning' in m.split('.')[0]];"
            "assert not early, early;"
            "from torch_tpu import _on_import as o;"
            "from torch_tpu._integrations import lightning as a;"
            "assert all(o.waiting(m) for m in a.PATCHES)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-4000:]


# ---------------------------------------------------------------- slow: training, against the CPU
@pytest.mark.slow
def test_trainer_auto_matches_cpu():
    """`import lightning as L`, `L.Trainer()` with the default accelerator ("auto")."""
    got = run("trainer", "auto", package="lightning")
    check_against_cpu(got, run("trainer", "cpu", package="lightning"))
    assert got[0]["checkpoint_diff"] == 0.0, got[0]


@pytest.mark.slow
def test_trainer_tpu_matches_cpu():
    check_against_cpu(run("trainer", "tpu"), run("trainer", "cpu", package="lightning"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("launch", ["lightning_launcher", "torchrun"])
def test_trainer_ddp_matches_cpu(launch):
    """`python script.py` (Lightning re-runs the script for rank 1), and torchrun. (The
    fast test above checks that the accelerator pickles, which strategy="ddp_spawn" needs;
    a spawn run needs the module and its hooks at a script's top level, which these
    scripts inside a test file are not.)"""
    got = run("trainer", "tpu", devices=2, torchrun=launch == "torchrun")
    check_against_cpu(got, run("trainer", "cpu", devices=2), by_rank=launch == "torchrun")


@pytest.mark.slow
def test_fabric_matches_cpu():
    check_against_cpu(run("fabric", "tpu", package="lightning"),
                      run("fabric", "cpu", package="lightning"))


@pytest.mark.slow
@pytest.mark.distributed
def test_fabric_ddp_matches_cpu():
    check_against_cpu(run("fabric", "auto", devices=2), run("fabric", "cpu", devices=2))


@pytest.mark.slow
@pytest.mark.parametrize("script,precision,compute", [
    ("trainer", "bf16-mixed", "bfloat16"), ("fabric", "bf16-true", "bfloat16")])
def test_bf16_matches_cpu(script, precision, compute):
    got = run(script, "tpu", precision=precision)
    assert got[0]["autocast"] == ("tpu" if precision.endswith("mixed") else None), got[0]
    check_against_cpu(got, run(script, "cpu", precision=precision), tolerance=BF16_TOLERANCE,
                      compute=compute)


if __name__ == "__main__":
    kind, out, pkg, acc, n, prec = sys.argv[1:7]
    {"trainer": trainer_script, "fabric": fabric_script}[kind](out, pkg, acc, int(n), prec)
