"""A nanoGPT-style training script written for CUDA (Karpathy's model.py and the shape of
train.py / sample.py, shrunk to a toy size): a GPT with weight tying and flash attention
through `F.scaled_dot_product_attention`, nanoGPT's `configure_optimizers` (fused AdamW
on CUDA), `torch.compile(model)` with no arguments, a few training steps, then sampling
with `generate` (top_k=1, so the sampled tokens are the argmax and comparable across
devices).

Knobs for sampling alone (tests/modes/test_growing.py): MAX_ITERS=0 skips training,
BLOCK_SIZE sets the context, SAMPLE_TOKENS how many tokens `generate` samples (its `idx`
grows by one each, with `torch.cat`), NUM_SAMPLES how many times (sample.py's loop).

tests/compile/test_default_compile.py runs it after a whole-file `s/cuda/tpu/g` (the only edit),
and as written with FORCE_CPU=1 COMPILE=0 for the CPU eager reference. It prints one line,
"RESULT {json}".
"""
import inspect
import json
import math
import os
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = int(os.environ.get("BLOCK_SIZE", "16"))
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "wpe": nn.Embedding(config.block_size, config.n_embd),
            "drop": nn.Dropout(config.dropout),
            "h": nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            "ln_f": LayerNorm(config.n_embd, bias=config.bias),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [{"params": decay_params, "weight_decay": weight_decay},
                        {"params": nodecay_params, "weight_decay": 0.0}]
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == "cuda"
        extra_args = {"fused": True} if use_fused else {}
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


# ---------------------------------------------------------------- train.py, shrunk
batch_size = 4
max_iters = int(os.environ.get("MAX_ITERS", "8"))
learning_rate = 3e-3
device = "cpu" if os.environ.get("FORCE_CPU") else "cuda"
compile = os.environ.get("COMPILE", "1") == "1"
device_type = "cuda" if "cuda" in device else "cpu"

torch.manual_seed(1337)
config = GPTConfig()
# a fixed toy corpus: token i is followed by token (3 * i + 1) % vocab, so the model can learn it
data = torch.zeros(512, dtype=torch.long)
for i in range(1, len(data)):
    data[i] = (3 * data[i - 1] + 1 + (i % 7 == 0)) % config.vocab_size
g = torch.Generator().manual_seed(0)


def get_batch():
    ix = torch.randint(len(data) - config.block_size - 1, (batch_size,), generator=g)
    x = torch.stack([data[i:i + config.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + config.block_size] for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model = GPT(config).to(device)
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), device_type)
if compile:
    model = torch.compile(model)  # requires PyTorch 2.0

losses, step_ms = [], []
model.train()
for it in range(max_iters):
    t0 = time.perf_counter()
    X, Y = get_batch()
    logits, loss = model(X, Y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    step_ms.append((time.perf_counter() - t0) * 1000)

# ---------------------------------------------------------------- sample.py
def programs():
    """The XLA programs this process built so far, compiled or read from the disk cache
    (0 on CPU)."""
    if device == "cpu":
        return 0
    kinds = torch.cuda.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


model.eval()
start = torch.tensor([[1, 4, 13]], dtype=torch.long, device=device)
num_samples = int(os.environ.get("NUM_SAMPLES", "1"))  # sample.py's loop over samples
with torch.no_grad():
    last_logits, _ = model(start)  # the compiled model's inference graph
    before = programs()
    for k in range(num_samples):
        at = programs()
        t0 = time.perf_counter()
        y = model.generate(start, max_new_tokens=int(os.environ.get("SAMPLE_TOKENS", "6")),
                           temperature=0.8, top_k=1)
        sample = y[0].tolist()
        sample_s = time.perf_counter() - t0
        if k == 0:
            first_programs = programs() - before

print("RESULT " + json.dumps({
    "rank": int(os.environ.get("RANK", "0")), "device": str(last_logits.device),
    "losses": losses, "sample": sample,
    "sample_device": str(y.device), "last_logits": last_logits[0, -1].tolist(),
    "sample_programs": first_programs, "last_call_programs": programs() - at,
    "sample_s": sample_s, "step_ms": step_ms}))
