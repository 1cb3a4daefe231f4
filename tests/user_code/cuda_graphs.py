"""CUDA graphs as PyTorch's documentation writes them, for CUDA: a whole training step
(forward, backward, capturable AdamW) warmed up on a side stream, captured with
`torch.cuda.graph` and replayed over new data copied into its static inputs; then a decode
step of a small language model with a static KV cache, captured and replayed once per
token, its tokens kept on the device until the end.

FORCE_CPU=1 runs the same steps eagerly on the CPU (no graphs there); GRAPHS=0 runs them
eagerly on the accelerator; DROPOUT=p puts dropout in the network (its masks then follow
the device's generator: compare with the same device only). Prints "RESULT {json}".
"""
import contextlib
import json
import os

import torch
from torch import nn

device = "cpu" if os.environ.get("FORCE_CPU") == "1" else "cuda"
graphs = device == "cuda" and os.environ.get("GRAPHS", "1") == "1"
dropout = float(os.environ.get("DROPOUT", "0"))
STEPS, TOKENS = 6, 12


def compiled_programs():
    if device == "cpu" or not hasattr(torch, "tpu"):
        return 0
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


# ---------------------------------------------------------------- a training step
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 8)).to(device)
loss_fn = nn.MSELoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=device == "cuda")
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(STEPS)]
static_input = torch.randn(16, 32, generator=g).to(device)
static_target = torch.randn(16, 8, generator=g).to(device)


def train_step():
    y_pred = model(static_input)
    loss = loss_fn(y_pred, static_target)
    loss.backward()
    optimizer.step()
    return loss


# warm up on a side stream (the documentation's recipe), so that AdamW's state exists
s = torch.cuda.Stream() if device == "cuda" else None
if s is not None:
    s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s) if s is not None else contextlib.nullcontext():
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        train_step()
if s is not None:
    torch.cuda.current_stream().wait_stream(s)

optimizer.zero_grad(set_to_none=True)
if graphs:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = train_step()
before = compiled_programs()
losses = []
for data, target in batches:
    static_input.copy_(data)
    static_target.copy_(target)
    if graphs:
        graph.replay()
    else:
        optimizer.zero_grad(set_to_none=True)
        static_loss = train_step()
    losses.append(static_loss.item())
train_built = compiled_programs() - before
params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]


# ---------------------------------------------------------------- a decode step
class TinyLM(nn.Module):
    """One attention block over a static KV cache of `ctx` positions."""

    def __init__(self, vocab=64, dim=32, ctx=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("k_cache", torch.zeros(1, ctx, dim))
        self.register_buffer("v_cache", torch.zeros(1, ctx, dim))
        self.scale = dim ** -0.5

    def forward(self, tok, pos):
        x = self.emb(tok)                                   # (1, 1, dim)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        self.k_cache.index_copy_(1, pos, k)
        self.v_cache.index_copy_(1, pos, v)
        att = (q @ self.k_cache.transpose(1, 2)) * self.scale
        seen = torch.arange(self.k_cache.shape[1], device=tok.device) <= pos
        att = att.masked_fill(~seen, float("-inf")).softmax(dim=-1)
        return self.head(self.proj(att @ self.v_cache) + x)  # (1, 1, vocab)


torch.manual_seed(2)
lm = TinyLM().to(device).eval()
tok = torch.tensor([[5]], device=device)
pos = torch.zeros(1, dtype=torch.long, device=device)
out = torch.zeros(TOKENS, dtype=torch.long, device=device)


@torch.no_grad()
def decode_step():
    logits = lm(tok, pos)
    nxt = logits[:, -1].argmax(dim=-1)
    out.index_copy_(0, pos, nxt)
    tok.copy_(nxt.view(1, 1))
    pos.add_(1)


if graphs:
    decode = torch.cuda.CUDAGraph()
    with torch.cuda.graph(decode):
        decode_step()
before = compiled_programs()
for _ in range(TOKENS):
    decode.replay() if graphs else decode_step()
decode_built = compiled_programs() - before
tokens = out.cpu().tolist()
print("RESULT " + json.dumps({"rank": 0, "losses": losses, "params": params, "tokens": tokens,
                              "train_built": train_built, "decode_built": decode_built,
                              "graphs": graphs}))
