"""The trainable workloads by name, as the demo and `bench compile` run them: each family's
default spec, builder, batches (tuples of CPU tensors) and optimizer, its training loss and
inference output, and its hand-written JAX twin."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from . import decoder, gpt


@dataclasses.dataclass(frozen=True)
class Model:
    """A trainable workload: how to build it, its batches (tuples of CPU tensors), optimizer,
    training loss and inference output, and its hand-written JAX twin: `jax(model)` ->
    (params keyed by `named_parameters()`, loss_fn(params, *batch), forward(params, x))."""
    name: str
    spec: object                                    # the default size
    describe: Callable[[object], str]
    build: Callable[[object], torch.nn.Module]
    batches: Callable[[object, int], list]
    optimizer: Callable[[torch.nn.Module, object], torch.optim.Optimizer]
    loss: Callable                                  # (forward callable, *batch) -> loss
    infer: Callable                                 # (forward callable, x) -> output
    jax: Callable


def _llama_batches(spec, n):
    return [(ids,) for ids in decoder.learnable_batches(spec, n)]


LLAMA = Model(
    "small Llama", decoder.DecoderSpec(),
    lambda s: (f"HF LlamaForCausalLM, hidden {s.hidden}, {s.layers} layers, {s.heads} heads, "
               f"vocab {s.vocab}, batch {s.batch} x seq {s.seq}, AdamW lr {s.lr}"),
    decoder.build_model, _llama_batches, decoder.make_optimizer,
    lambda f, ids: f(input_ids=ids, labels=ids).loss,
    lambda f, ids: f(input_ids=ids).logits,
    lambda model: decoder.jax_llama_math(model)[:3])
GPT = Model(
    "GPT", gpt.GPTSpec(),
    lambda s: (f"nanoGPT-style GPT-2, width {s.width}, {s.layers} layers, {s.heads} heads, "
               f"vocab {s.vocab}, tied embeddings, batch {s.batch} x block {s.block}, "
               f"AdamW lr {s.lr}, betas {s.betas}, weight decay {s.weight_decay} on matrices"),
    gpt.build_model, gpt.make_batches, gpt.make_optimizer,
    lambda f, x, y: f(x, y)[1],
    lambda f, x: f(x)[0],
    gpt.jax_gpt)
MODELS = {"llama": LLAMA, "gpt": GPT}
