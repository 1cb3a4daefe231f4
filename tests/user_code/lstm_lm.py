"""PyTorch's word_language_model example, the LSTM flavour, written for CUDA
(`device = "cuda"`): embedding -> 2-layer nn.LSTM -> linear decoder over the vocabulary,
trained by truncated backprop through time (bptt 35) with the hidden state carried across
batches (detached), clip_grad_norm_ and the example's hand-written SGD update.
tests/modes/test_compile_guard.py runs it with cuda -> tpu swapped, and with FORCE_CPU=1 for the
reference losses. No dropout, so the CPU and device runs draw no random numbers.

It times every step to its loss's `.item()` and, on the device, records torch_tpu's
counters after each step (fused graphs compiled and their sizes, cache hits, nodes
flushed, compile seconds). It prints one line, "RESULT {json}".
"""
import json
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

device = "cpu" if os.environ.get("FORCE_CPU") == "1" else "cuda"
VOCAB, EMSIZE, NHID, NLAYERS = 200, 48, 64, 2
BATCH, LR, CLIP = 8, 20.0, 0.25
BPTT = int(os.environ.get("BPTT", "35"))
STEPS = int(os.environ.get("STEPS", "4"))

torch.manual_seed(0)
stream = torch.randint(0, VOCAB, (BPTT * BATCH * (STEPS + 1) + 1,))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, EMSIZE)
        self.rnn = nn.LSTM(EMSIZE, NHID, NLAYERS)
        self.decoder = nn.Linear(NHID, VOCAB)
        self.encoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.zero_()

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.encoder(x), hidden)
        return F.log_softmax(self.decoder(output), dim=-1).view(-1, VOCAB), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(NLAYERS, bsz, NHID), weight.new_zeros(NLAYERS, bsz, NHID))


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


def counters():
    if device == "cpu":
        return {}
    from torch_tpu import metrics
    m = metrics.as_dict()
    c = m["counters"]
    keys = ("fused_graphs_compiled", "fused_cache_hits", "fused_nodes", "op_entries",
            "flush.loop", "flush.size_cap", "flush.compile_guard", "flush.backward")
    out = {k: c.get(k, 0) for k in keys}
    out["compile_seconds"] = round(m["compile_seconds"], 3)
    # the fused graphs compiled so far, by their size (a program's name says its op count)
    stats = torch.tpu.compile_cache_stats(programs=True)
    out["graph_nodes"] = sorted(int(p["name"].split("_")[1][:-3]) for p in stats["programs"]
                                if p["kind"] == "graph")
    return out


train_data = batchify(stream, BATCH)
model = RNNModel().to(device)
hidden = model.init_hidden(BATCH)
losses, seconds, after = [], [], []
for i in range(0, BPTT * STEPS, BPTT):
    t0 = time.perf_counter()
    data, targets = get_batch(train_data, i)
    hidden = repackage_hidden(hidden)
    model.zero_grad()
    output, hidden = model(data, hidden)
    loss = F.nll_loss(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-LR)
    losses.append(loss.item())
    seconds.append(round(time.perf_counter() - t0, 3))
    after.append(counters())
    print(f"step {len(losses)}: loss {losses[-1]:.5f}, {seconds[-1]:.2f} s, {after[-1]}",
          flush=True)
print("RESULT " + json.dumps({"rank": 0, "losses": losses, "seconds": seconds,
                              "counters": after}))
