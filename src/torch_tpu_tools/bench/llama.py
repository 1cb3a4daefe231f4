"""The small Llama workload shared by the demo and the benchmarks: a random-weight
HF `LlamaForCausalLM`, a learnable synthetic token task, and one AdamW training step.

No downloads: the model is built from a `LlamaConfig`, and HF_HUB_OFFLINE is set before
transformers is imported.
"""
from __future__ import annotations

import copy
import dataclasses
import os

import torch


@dataclasses.dataclass(frozen=True)
class LlamaSpec:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    vocab: int = 256
    seq: int = 32
    batch: int = 4
    lr: float = 3e-3
    seed: int = 0

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq


def build_model(spec: LlamaSpec) -> torch.nn.Module:
    """A Llama with random weights on CPU, fp32, deterministic from `spec.seed`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.hidden * 2,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=max(128, spec.seq),
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).float()
    model.train()
    return model


def make_batches(spec: LlamaSpec, n: int) -> list[torch.Tensor]:
    """`n` CPU batches of arithmetic sequences (start and stride random, mod vocab): a task
    the model can learn in a few steps, so the loss curve visibly falls."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    batches = []
    pos = torch.arange(spec.seq)
    for _ in range(n):
        start = torch.randint(0, spec.vocab, (spec.batch, 1), generator=g)
        stride = torch.randint(1, 4, (spec.batch, 1), generator=g)
        batches.append((start + stride * pos) % spec.vocab)
    return batches


def replicate(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """The same initial weights on `device` (the CPU model itself is left untouched)."""
    return copy.deepcopy(model).to(device)


def make_optimizer(model: torch.nn.Module, spec: LlamaSpec) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=spec.lr)


def train_step(model, opt, ids: torch.Tensor) -> torch.Tensor:
    """Forward, backward, AdamW step; returns the (unsynchronized) loss tensor."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()
