"""TRL's GRPOTrainer, unmodified, on the accelerator: one process and two under torchrun;
and RLOOTrainer in one process.

`user_script` is what a TRL user writes for a GPU, with no device named anywhere (as in
tests/models/test_trainer.py): transformers and accelerate pick the accelerator, which is this
package's once installed (torch autoloads it), and under torchrun accelerate joins the job
with the tpu_dist backend. The policy is a tiny Llama built from a config (random
weights), saved with a word-level tokenizer built in code, so nothing is downloaded; the
prompts are an in-memory dataset and the reward is a Python function (the fraction of
completion words equal to TARGET).

Each run is a subprocess, once as it is and once on the CPU (hidden by the standard
switches: TORCH_DEVICE_BACKEND_AUTOLOAD=0, ACCELERATE_USE_CPU=1). Completions are
sampled (temperature, top-k), so the two runs draw different tokens from different
generators and their logs cannot agree number for number. What is compared:
  - every logged loss, reward and KL is finite, rewards lie in [0, 1], KL >= 0;
  - the first step's KL is 0 (policy == reference) and its entropy (of the same random
    initial policy, nearly independent of the draws) agrees with the CPU run's within 2%;
  - the trend: the mean reward of the last steps exceeds that of the first steps by a
    clear margin on both (the reward signal is strong, the learning rate high);
  - the trained parameters live on the accelerator (on device index r for rank r).
Under torchrun the CPU reference stays the one-process run: the checks are per rank.
"""
from __future__ import annotations

import collections
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
STEPS = 10
TARGET = "w3"
pytestmark = pytest.mark.slow  # each run imports TRL and compiles a small Llama's programs


# ---------------------------------------------------------------- the user's script
def user_script(out_dir: str) -> None:
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                              TrainerCallback)
    import trl

    # TRL_TRAINER=rloo: the same run with RLOO (leave-one-out baselines), whose config and
    # trainer take the same arguments
    kind = os.environ.get("TRL_TRAINER", "grpo").upper()
    Config, Trainer = getattr(trl, f"{kind}Config"), getattr(trl, f"{kind}Trainer")

    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(14)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                        eos_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1)
    # GRPOTrainer loads its frozen reference model from the policy's path: save them first
    path = os.path.join(out_dir, "init")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)

    g = torch.Generator().manual_seed(1)
    prompts = [" ".join(f"w{int(i)}" for i in torch.randint(4, 14, (4,), generator=g))
               for _ in range(32)]

    def target_reward(completions, **kwargs):
        return [c.split().count(TARGET) / 6 for c in completions]

    args = Config(output_dir=out_dir, max_steps=STEPS, per_device_train_batch_size=16,
                      num_generations=8, max_completion_length=6, learning_rate=2e-2,
                      beta=0.04, temperature=1.0, top_k=12, logging_steps=1, seed=0,
                      # fp32 on both devices (GRPOConfig's default is bf16, which
                      # TrainingArguments refuses on a CPU-only run without use_cpu)
                      bf16=False,
                      save_strategy="no", report_to="none", disable_tqdm=True)
    programs = []  # (the test's instrument) the programs held after each step, by name

    class Programs(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if hasattr(torch, "tpu"):
                held = torch.tpu.compile_cache_stats(programs=True, disk=False)["programs"]
                programs.append(sorted(p["name"] for p in held))

    trainer = Trainer(model=path, reward_funcs=target_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tokenizer, callbacks=[Programs()])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    result = {key: [h[key] for h in logs] for key in ("loss", "reward", "kl", "entropy")}
    result.update(programs=programs, pad_to_multiple_of=args.pad_to_multiple_of,
                  lengths=[h["completions/max_length"] for h in logs],
                  min_lengths=[h["completions/min_length"] for h in logs])
    result.update(device=str(next(trainer.model.parameters()).device), world_size=args.world_size)
    with open(os.path.join(out_dir, f"result{args.process_index}.json"), "w") as f:
        json.dump(result, f)


# ---------------------------------------------------------------- running it
def run(*, cpu: bool, nproc: int = 1, trainer: str = "grpo") -> list[dict]:
    out_dir = tempfile.mkdtemp(prefix="trl_grpo_")
    env = dict(os.environ, TRL_TRAINER=trainer, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1", TORCH_TPU_RECOMPILE_WARN="0",
               PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    if cpu:
        env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", ACCELERATE_USE_CPU="1")
    cmd = [sys.executable, __file__, out_dir]
    if nproc > 1:
        from helpers.dist_launch import free_port

        cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                    "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    # ~400 programs compile in the first step; two ranks share the cores (measured at load
    # 7 on 2 cores: 75 s one process, 205-235 s two)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300 * nproc,
                       check=False)
    assert p.returncode == 0, (f"{'CPU' if cpu else 'accelerator'} run failed (exit "
                               f"{p.returncode}):\n{(p.stdout + p.stderr)[-8000:]}")
    results = []
    for rank in range(nproc):
        with open(os.path.join(out_dir, f"result{rank}.json")) as f:
            results.append(json.load(f))
    shutil.rmtree(out_dir, ignore_errors=True)
    return results


def check(got: list[dict], want: dict) -> None:
    """`got`: each rank's result; `want`: the one-process CPU run's."""
    import torch

    device = torch.accelerator.current_accelerator().type
    assert want["device"] == "cpu" and want["world_size"] == 1, want
    for r, g in enumerate(got):
        assert g["device"] == f"{device}:{r}" and g["world_size"] == len(got), (r, g)
        for run in (g, want):
            assert all(len(run[k]) == STEPS for k in ("loss", "reward", "kl", "entropy")), run
            assert all(math.isfinite(x) for k in ("loss", "reward", "kl", "entropy")
                       for x in run[k]), run
            assert all(0.0 <= x <= 1.0 for x in run["reward"]) and min(run["kl"]) >= 0, run
            assert run["kl"][0] == 0.0, run
            first, last = sum(run["reward"][:3]) / 3, sum(run["reward"][-3:]) / 3
            assert last > first + 0.1, (r, "the reward did not rise", run["reward"])
        assert abs(g["entropy"][0] - want["entropy"][0]) < 0.02 * want["entropy"][0], (g, want)


@pytest.fixture(scope="module")
def cpu_run() -> dict:
    return run(cpu=True)[0]


# TRL's completion-length metrics (grpo_trainer.py: the lengths of the completions that
# ended, picked by a boolean mask: a vector whose size is data) are held at the mask's
# length (op/lengths.py), so no step compiles for a new count of ended completions. What a
# later step may still build, once: the metrics of TRL's fallback when none ended (a
# `torch.zeros(1)` in their place), a shape of its own
EMPTY_FALLBACK = {"aten.mean.default", "aten.min.default", "aten.max.default"}


def test_grpo_trainer_trains_like_on_cpu(cpu_run):
    """Completions end at their own lengths (sampling stops at the end token), so steps
    meet new lengths; on tpu GRPOConfig's pad_to_multiple_of="auto" pads them to a
    multiple of min(64, max_completion_length) (torch_tpu/_integrations/trl.py): from the
    third step on, no model program compiles."""
    got = run(cpu=False)
    check(got, cpu_run)
    check_programs(got[0], cpu_run)


def test_rloo_trainer_trains_like_on_cpu():
    """RLOOTrainer, the same run: its config pads the same way."""
    want = run(cpu=True, trainer="rloo")[0]
    got = run(cpu=False, trainer="rloo")
    check(got, want)
    check_programs(got[0], want)


def check_programs(got: dict, cpu_run: dict) -> None:
    assert got["pad_to_multiple_of"] == 6 and cpu_run["pad_to_multiple_of"] is None
    assert len(set(got["min_lengths"])) > 1, got  # the lengths did vary
    for step in range(2, STEPS):
        before, after = (collections.Counter(got["programs"][i]) for i in (step - 1, step))
        new = sorted((after - before).elements())
        assert set(new) <= EMPTY_FALLBACK and len(new) <= 3, (step + 1, new)


@pytest.mark.distributed
def test_grpo_trainer_torchrun_two_processes(cpu_run):
    """Two ranks, each generating and training on its own 16 completions; DDP over
    tpu_dist averages the gradients. Compared with the one-process CPU run (the same
    checks: each rank's own logs are finite and rising, its first entropy agrees)."""
    check(run(cpu=False, nproc=2), cpu_run)


if __name__ == "__main__":
    user_script(sys.argv[1])
