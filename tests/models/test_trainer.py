"""HF Trainer, unmodified: train, evaluate, save_model and from_pretrained on the accelerator.

`user_script` below is what a user writes, with no device named anywhere in it (nor in
this file): the device is the accelerator that transformers and accelerate detect, which
is this package's once it is installed (torch loads it through its device-backend
autoload, so the script does not even import it). Each run is a subprocess, once as it
is and once on the CPU, and the losses must agree within 1e-4.

The CPU run hides the accelerator by standard means, not by a line in the script:
  - TORCH_DEVICE_BACKEND_AUTOLOAD=0, torch's own switch, loads no out-of-tree backend,
    so the process is plain CPU torch (the counterpart of hiding every GPU);
  - ACCELERATE_USE_CPU=1, accelerate's own switch (what `accelerate launch --cpu` sets),
    which transformers reads too. One process does not need it, but under torchrun
    accelerate on a machine without an accelerator runs every process alone unless it is
    told to use the CPU, and then it trains with DDP over gloo.
Both runs print the device of the trained parameters, which the tests check: the
accelerator's type in the first run, "cpu" in the second.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
STEPS = 3
TOLERANCE = 1e-4
pytestmark = pytest.mark.slow  # each run imports transformers and compiles a small Llama


# ---------------------------------------------------------------- the user's script
def user_script(out_dir: str, optim: str | None) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (24, 16), generator=torch.Generator().manual_seed(1))
    train = [{"input_ids": x, "labels": x} for x in ids[:16]]
    evaluation = [{"input_ids": x, "labels": x} for x in ids[16:]]

    extra = {"optim": optim} if optim else {}
    args = TrainingArguments(output_dir=out_dir, max_steps=STEPS, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, learning_rate=5e-3, logging_steps=1,
                             save_strategy="no", report_to="none", disable_tqdm=True, **extra)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(os.path.join(out_dir, "model"))

    result = {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "eval_loss": metrics["eval_loss"],
        "device": str(next(model.parameters()).device),
        "optimizer": type(trainer.optimizer.optimizer).__name__,
        "fused": bool(trainer.optimizer.optimizer.defaults.get("fused")),
        "world_size": args.world_size,
    }
    if trainer.is_world_process_zero():
        reloaded = LlamaForCausalLM.from_pretrained(os.path.join(out_dir, "model")).to(args.device)
        batch = ids[16:20].to(args.device)
        with torch.no_grad():
            trained_logits = model(batch).logits.cpu()
            reloaded_logits = reloaded(batch).logits.cpu()
        result["reload_device"] = str(next(reloaded.parameters()).device)
        result["reload_max_diff"] = (trained_logits - reloaded_logits).abs().max().item()
    with open(os.path.join(out_dir, f"result{args.process_index}.json"), "w") as f:
        json.dump(result, f)


# ---------------------------------------------------------------- running it
def _env(cpu: bool) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    if cpu:
        env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", ACCELERATE_USE_CPU="1")
    return env


class RunFailed(RuntimeError):
    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


def run(*, cpu: bool, optim: str | None = None, nproc: int = 1, timeout: float = 420) -> list[dict]:
    """Run the user's script (under torchrun when nproc > 1); one result per process."""
    out_dir = tempfile.mkdtemp(prefix="trainer_")
    script = [__file__, out_dir] + (["--optim", optim] if optim else [])
    if nproc == 1:
        cmd = [sys.executable] + script
    else:
        from helpers.dist_launch import free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               "--master-addr=127.0.0.1", f"--master-port={free_port()}"] + script
    p = subprocess.run(cmd, env=_env(cpu), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        output = p.stdout + p.stderr
        raise RunFailed(f"{'CPU' if cpu else 'accelerator'} run failed "
                        f"(exit {p.returncode}):\n{output[-8000:]}", output)
    results = []
    for rank in range(nproc):
        with open(os.path.join(out_dir, f"result{rank}.json")) as f:
            results.append(json.load(f))
    return results


def accelerator_type() -> str:
    import torch

    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type != "cpu", "no accelerator registered in this process"
    return acc.type


def check_against_cpu(got: list[dict], want: list[dict], fused: bool) -> None:
    device = accelerator_type()
    for r, (g, w) in enumerate(zip(got, want)):
        assert g["device"].split(":")[0] == device, (r, g["device"])
        if len(got) > 1:  # under torchrun, as with CUDA: local rank r trains on device index r
            assert g["device"] == f"{device}:{r}", (r, g["device"])
        assert w["device"] == "cpu", (r, w["device"])
        assert g["world_size"] == w["world_size"] == len(got)
        assert g["fused"] is w["fused"] is fused, (g, w)
        assert len(g["losses"]) == len(w["losses"]) == STEPS, (g, w)
        assert all(math.isfinite(x) for x in g["losses"])
        assert max(abs(a - b) for a, b in zip(g["losses"], w["losses"])) < TOLERANCE, (r, g, w)
        assert abs(g["eval_loss"] - w["eval_loss"]) < TOLERANCE, (r, g, w)
    # the saved folder loads back to the same model, on the same device
    assert got[0]["reload_device"] == got[0]["device"], got[0]
    assert got[0]["reload_max_diff"] < 1e-6, got[0]
    assert want[0]["reload_max_diff"] < 1e-6, want[0]


@pytest.mark.parametrize("optim", [None, "adamw_torch"], ids=["default_optim", "adamw_torch"])
def test_trainer_matches_cpu(optim):
    check_against_cpu(run(cpu=False, optim=optim), run(cpu=True, optim=optim), fused=optim is None)


@pytest.mark.distributed
def test_trainer_ddp_torchrun_matches_cpu_gloo():
    got = run(cpu=False, nproc=2)  # the default optimizer, fused AdamW
    want = run(cpu=True, nproc=2)
    check_against_cpu(got, want, fused=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    optim = argv[argv.index("--optim") + 1] if "--optim" in argv else None
    user_script(argv[0], optim)
