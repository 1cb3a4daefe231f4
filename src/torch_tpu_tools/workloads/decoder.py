"""The decoder family: small HF causal LMs (Llama, Qwen2) with random weights, built from
configs (no download), and the same Llama in pure JAX.

`DecoderSpec` holds the model's sizes and the synthetic workload's shapes (training batch,
generation prompt); `build_model(spec, kind)` is the one builder. Two token tasks:
`learnable_batches` (arithmetic sequences, so a loss curve visibly falls) and
`random_batches`. `jax_llama_math(model)` is HF's LlamaForCausalLM in JAX on the model's
weights (whole sequences, or against a KV cache), for the `jax.jit` contestants of
`bench compile` (the training step) and `bench scaling` (greedy generation).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from . import offline

KINDS = ("llama", "qwen2")


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None  # None: one per attention head (no GQA)
    vocab: int = 256
    seq: int = 32                # training sequence length
    batch: int = 4               # training batch
    lr: float = 3e-3
    prompt: int = 8              # generation: prompt length
    new_tokens: int = 8          # greedy tokens per generate call
    gen_batch: int = 2
    # pad_token_id: HF gives the embedding a padding row (zero at init, never trained), so
    # it changes the initial weights; the generation benches set 0, the training ones none
    pad: int | None = None
    seed: int = 0

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    @property
    def infer_tokens(self) -> int:
        return self.gen_batch * self.new_tokens

    def describe(self) -> str:
        return (f"hidden {self.hidden}, {self.layers} layers, {self.heads} heads "
                f"({self.kv_heads or self.heads} KV), vocab {self.vocab}, fp32; train batch x "
                f"seq = {self.batch} x {self.seq}; generate: batch {self.gen_batch}, prompt "
                f"{self.prompt}, {self.new_tokens} new tokens")


def build_model(spec: DecoderSpec, kind: str = "llama") -> torch.nn.Module:
    """A random-weight HF causal LM on CPU, fp32, in train mode, deterministic from
    `spec.seed`. No EOS token, so greedy decoding produces exactly `max_new_tokens`."""
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose from {KINDS}")
    offline()
    import transformers

    config_cls, cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                       "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    config = config_cls(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=2 * spec.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads or spec.heads,
        # RoPE's angles are computed per position: this bound changes no weight or value
        max_position_embeddings=max(128, spec.seq, spec.prompt + spec.new_tokens),
        tie_word_embeddings=False, attn_implementation="sdpa",
        bos_token_id=None, eos_token_id=None, pad_token_id=spec.pad)
    torch.manual_seed(spec.seed)
    model = cls(config).float()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def learnable_batches(spec: DecoderSpec, n: int) -> list[torch.Tensor]:
    """`n` CPU batches of arithmetic sequences (start and stride random, mod vocab): a task
    the model learns in a few steps."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    pos = torch.arange(spec.seq)
    batches = []
    for _ in range(n):
        start = torch.randint(0, spec.vocab, (spec.batch, 1), generator=g)
        stride = torch.randint(1, 4, (spec.batch, 1), generator=g)
        batches.append((start + stride * pos) % spec.vocab)
    return batches


def random_batches(spec: DecoderSpec, lengths: list[int]) -> list[torch.Tensor]:
    """CPU batches of uniformly random tokens, one per entry of `lengths` (its sequence
    length)."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    return [torch.randint(0, spec.vocab, (spec.batch, n), generator=g) for n in lengths]


def prompt_ids(spec: DecoderSpec) -> torch.Tensor:
    """The generation prompts: `gen_batch` x `prompt` random tokens, none the pad token 0."""
    g = torch.Generator().manual_seed(spec.seed + 2)
    return torch.randint(1, spec.vocab, (spec.gen_batch, spec.prompt), generator=g)


def make_optimizer(model: torch.nn.Module, spec: DecoderSpec) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=spec.lr)


def train_step(model, opt, ids: torch.Tensor) -> torch.Tensor:
    """Forward, backward, AdamW step; returns the (unsynchronized) loss tensor."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def jax_llama_math(model):
    """(params, loss_fn(p, ids), forward(p, ids), cached(p, ids, pos0, ck, cv)): a JAX Llama
    equal to HF's LlamaForCausalLM with the weights of `model` (fp32, no GQA), params keyed
    by `model.named_parameters()` names. `forward` gives every position's logits; `cached`
    runs `ids` at positions pos0.. against a KV cache (ck, cv: layers x batch x heads x
    length x head size), writes their keys and values into it, and gives the last
    position's logits and the two caches."""
    import jax
    import jax.numpy as jnp

    cfg = model.config
    hidden, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = hidden // nh
    eps = cfg.rms_norm_eps
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    params = {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.named_parameters()}

    def rms(x, w):
        return w * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps))

    def rotate(x):
        return jnp.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)

    def softmax_attention(q, k, v, visible):
        scores = jnp.where(visible, q @ k.swapaxes(-1, -2) / math.sqrt(hd), -jnp.inf)
        return jax.nn.softmax(scores, -1) @ v

    def layers(p, ids, pos0, attend):
        """The final hidden states of `ids` (b, s) at positions pos0..; attend(layer, pos,
        q, k, v) is the attention of each layer."""
        b, s = ids.shape
        pos = pos0 + jnp.arange(s)
        inv = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
        freqs = pos.astype(jnp.float32)[:, None] * inv[None]
        emb = jnp.concatenate([freqs, freqs], -1)
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        x = p["model.embed_tokens.weight"][ids]
        for i in range(cfg.num_hidden_layers):
            pre = f"model.layers.{i}."
            h = rms(x, p[pre + "input_layernorm.weight"])
            q, k, v = ((h @ p[pre + f"self_attn.{n}.weight"].T).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
                       for n in ("q_proj", "k_proj", "v_proj"))
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
            attn = attend(i, pos, q, k, v)
            x = x + attn.transpose(0, 2, 1, 3).reshape(b, s, hidden) @ p[pre + "self_attn.o_proj.weight"].T
            h = rms(x, p[pre + "post_attention_layernorm.weight"])
            gate = jax.nn.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
        return rms(x, p["model.norm.weight"])

    def forward(p, ids):
        def causal(i, pos, q, k, v):
            return softmax_attention(q, k, v, pos[None, :] <= pos[:, None])

        return layers(p, ids, 0, causal) @ p["lm_head.weight"].T

    def loss_fn(p, ids):
        logp = jax.nn.log_softmax(forward(p, ids)[:, :-1], -1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1))

    def cached(p, ids, pos0, ck, cv):
        caches = [ck, cv]  # each layer's attention writes its keys and values in turn

        def attend(i, pos, q, k, v):
            caches[0] = jax.lax.dynamic_update_slice(caches[0], k[None], (i, 0, 0, pos0, 0))
            caches[1] = jax.lax.dynamic_update_slice(caches[1], v[None], (i, 0, 0, pos0, 0))
            visible = jnp.arange(caches[0].shape[3])[None, :] <= pos[:, None]
            return softmax_attention(q, caches[0][i], caches[1][i], visible)

        x = layers(p, ids, pos0, attend)
        return x[:, -1] @ p["lm_head.weight"].T, caches[0], caches[1]

    return params, loss_fn, forward, cached


def tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """Megatron-style TP on every decoder layer: q/k/v and gate/up projections split by
    output features (ColwiseParallel), o/down projections by input features
    (RowwiseParallel) with one all-reduce of their partial outputs. Each rank then holds
    heads/tp attention heads; HF's attention infers the local head count from shapes."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)
