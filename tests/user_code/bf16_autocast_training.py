"""bf16 autocast training of a small causal transformer, written for CUDA: what torchtitan
and most recipes do (linear layers without bias, causal SDPA, RMSNorm, AdamW), plus bare
bf16 products (mm, batched matmul with broadcasting, an einsum contracting a middle
dimension, a linear with bias) and the attention forms that keep XLA's lowering on tpu
(a mask, grouped heads, a value head size unlike the query's).

tests/ops/test_cpu_kernels.py runs it after `s/cuda/tpu/g` and as written with FORCE_CPU=1;
COMPILE=1 trains the model under torch.compile. It prints "RESULT {json}": each step's
loss, the products' values, and on tpu torch_tpu.metrics' `cpu_kernels.*` counters.
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cpu" if os.environ.get("FORCE_CPU") else "cuda"
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=True)
        self.n1, self.n2 = nn.RMSNorm(dim), nn.RMSNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.silu(self.up(self.n2(x))))


class Model(nn.Module):
    def __init__(self, vocab=64, dim=64, heads=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


model = Model().to(device)
run = torch.compile(model) if os.environ.get("COMPILE") else model
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
data = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(1)).to(device)
losses = []
for step in range(int(os.environ.get("STEPS", "3"))):
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = run(data[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, 64), data[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())

g = torch.Generator().manual_seed(2)


def rand(*shape):
    return torch.randn(*shape, generator=g).to(device, torch.bfloat16)


a, b = rand(48, 40), rand(40, 24)
x, w = rand(3, 1, 20, 40), rand(5, 40, 12)
e1, e2 = rand(6, 7, 8), rand(8, 6, 9)
lin_w, lin_b = rand(24, 40), rand(24)
q, k, v = rand(2, 4, 10, 16), rand(2, 4, 12, 16), rand(2, 4, 12, 16)
mask = torch.rand(10, 12, generator=g).to(device) > 0.3
products = {
    "mm": a @ b,
    "matmul_broadcast": x @ w,
    "einsum_middle": torch.einsum("bik,kbj->bij", e1, e2),
    "linear_bias": F.linear(a, lin_w, lin_b),
    "sdpa": F.scaled_dot_product_attention(q, k, v),
    "sdpa_mask": F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    "sdpa_gqa": F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], enable_gqa=True),
    "sdpa_value_size": F.scaled_dot_product_attention(q, k, rand(2, 4, 12, 24)),
}
out = {"rank": 0, "losses": losses,
       "products": {name: t.float().flatten().tolist() for name, t in products.items()}}
if device != "cpu":
    import torch_tpu
    counters = torch_tpu.metrics.as_dict()["counters"]
    out["counters"] = {n: c for n, c in counters.items() if n.startswith("cpu_kernels.")}
print("RESULT " + json.dumps(out))
