"""The GPT family: a nanoGPT-style GPT-2, written the way public training scripts write
it, and its hand-written JAX twin.

The torch model follows Karpathy's nanoGPT `model.py`: `nn.Linear` attention (one fused
q/k/v projection) into `F.scaled_dot_product_attention(is_causal=True)`, a GELU MLP of 4x
width, pre-LayerNorm blocks with biases, learned positions, the token embedding tied to
`lm_head`, GPT-2's init (std 0.02, residual projections scaled by 1/sqrt(2 * layers)),
and `configure_optimizers`' AdamW with two parameter groups (weight decay on the matrices
only). `forward(idx, targets)` returns `(logits, loss)`; without targets only the last
position's logits, as nanoGPT's `generate` uses them.

`jax_gpt(model)` is the same math in pure JAX on the same weights, for the `jax.jit`
contestant of `bench compile` (which adds the AdamW step, bench/compile.py).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class GPTSpec:
    layers: int = 2
    width: int = 128
    heads: int = 4
    block: int = 64
    batch: int = 8
    vocab: int = 256
    lr: float = 1e-3            # nanoGPT's shakespeare_char settings
    betas: tuple = (0.9, 0.99)
    weight_decay: float = 0.1
    seed: int = 0

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.block


# ---------------------------------------------------------------- the torch model (nanoGPT)
class CausalSelfAttention(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.c_attn = nn.Linear(spec.width, 3 * spec.width)
        self.c_proj = nn.Linear(spec.width, spec.width)
        self.n_head, self.n_embd = spec.heads, spec.width

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.c_fc = nn.Linear(spec.width, 4 * spec.width)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * spec.width, spec.width)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.width)
        self.attn = CausalSelfAttention(spec)
        self.ln_2 = nn.LayerNorm(spec.width)
        self.mlp = MLP(spec)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.spec = spec
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(spec.vocab, spec.width),
            "wpe": nn.Embedding(spec.block, spec.width),
            "h": nn.ModuleList([Block(spec) for _ in range(spec.layers)]),
            "ln_f": nn.LayerNorm(spec.width),
        })
        self.lm_head = nn.Linear(spec.width, spec.vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * spec.layers))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def build_model(spec: GPTSpec) -> GPT:
    """The GPT with GPT-2's random init on CPU, fp32, deterministic from `spec.seed`."""
    torch.manual_seed(spec.seed)
    model = GPT(spec).float()
    model.train()
    return model


def make_optimizer(model: GPT, spec: GPTSpec) -> torch.optim.Optimizer:
    return model.configure_optimizers(spec.weight_decay, spec.lr, spec.betas)


def make_batches(spec: GPTSpec, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` CPU batches (x, y) as nanoGPT's get_batch cuts them from a token stream, y being
    x shifted by one; the stream is arithmetic sequences mod vocab, a task the model learns
    in a few steps."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    pos = torch.arange(spec.block + 1)
    out = []
    for _ in range(n):
        start = torch.randint(0, spec.vocab, (spec.batch, 1), generator=g)
        stride = torch.randint(1, 4, (spec.batch, 1), generator=g)
        seq = (start + stride * pos) % spec.vocab
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def train_step(model, opt, x, y) -> torch.Tensor:
    """nanoGPT's training iteration: forward, backward, AdamW step; the loss, unsynchronized."""
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# ---------------------------------------------------------------- the hand-written JAX twin
def jax_gpt(model: GPT):
    """(params, loss_fn(p, x, y), forward(p, x)) in pure JAX, equal to `model`'s math on
    its weights; params are keyed by `model.named_parameters()` names (the tied embedding
    once, as `transformer.wte.weight`)."""
    import jax
    import jax.numpy as jnp

    spec = model.spec
    nh, hd = spec.heads, spec.width // spec.heads
    params = {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.named_parameters()}

    def layer_norm(x, p, name):
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    def linear(x, p, name):
        return x @ p[name + ".weight"].T + p[name + ".bias"]

    def hidden(p, idx):
        b, t = idx.shape
        x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:t]
        causal = jnp.tril(jnp.ones((t, t), bool))
        for i in range(spec.layers):
            pre = f"transformer.h.{i}."
            qkv = linear(layer_norm(x, p, pre + "ln_1"), p, pre + "attn.c_attn")
            q, k, v = (a.reshape(b, t, nh, hd).transpose(0, 2, 1, 3) for a in jnp.split(qkv, 3, -1))
            scores = jnp.where(causal, q @ k.swapaxes(-1, -2) / math.sqrt(hd), -jnp.inf)
            y = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, t, spec.width)
            x = x + linear(y, p, pre + "attn.c_proj")
            h = jax.nn.gelu(linear(layer_norm(x, p, pre + "ln_2"), p, pre + "mlp.c_fc"),
                            approximate=False)
            x = x + linear(h, p, pre + "mlp.c_proj")
        return layer_norm(x, p, "transformer.ln_f")

    def loss_fn(p, idx, targets):
        logits = hidden(p, idx) @ p["transformer.wte.weight"].T
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

    def forward(p, idx):
        return hidden(p, idx)[:, -1:] @ p["transformer.wte.weight"].T

    return params, loss_fn, forward
