"""A word-level language model trained the way PyTorch's word_language_model example
batches its data: one long token stream, batchified into columns, and each batch a slice
`source[i:i + bptt]` of it, the targets the slice one row on. Written for CUDA
(`device = "cuda"`); tests/modes/test_dynamic_shapes.py runs it with cuda -> tpu swapped, and
with FORCE_CPU=1 for the reference losses.

COMPILE=1 wraps the model in torch.compile(backend=BACKEND). After each batch it records
torch_tpu's program counters, so the test can see what each batch compiled. It prints one
line, "RESULT {json}".
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cpu" if os.environ.get("FORCE_CPU") == "1" else "cuda"
BPTT, BATCH, VOCAB, STEPS = 12, 4, 50, 7

torch.manual_seed(0)
stream = torch.randint(0, VOCAB, (BPTT * BATCH * (STEPS + 1) + 1,))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class WordLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, 32)
        self.hidden = nn.Linear(32, 32)
        self.decoder = nn.Linear(32, VOCAB)

    def forward(self, x):
        return self.decoder(torch.tanh(self.hidden(self.encoder(x))))


train_data = batchify(stream, BATCH)
model = WordLM().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
run = torch.compile(model, backend=os.environ.get("BACKEND", "inductor")) \
    if os.environ.get("COMPILE") == "1" else model


def programs():
    if device == "cpu":
        return 0
    from torch_tpu import metrics
    c = metrics.as_dict()["counters"]
    return sum(c.get(k, 0) for k in ("op_entries", "fused_graphs_compiled", "compile.executables"))


losses, compiled = [], []
for i in range(0, BPTT * STEPS, BPTT):
    data, targets = get_batch(train_data, i)
    opt.zero_grad()
    loss = F.cross_entropy(run(data).view(-1, VOCAB), targets)
    loss.backward()
    opt.step()
    losses.append(loss.item())
    compiled.append(programs())
print("RESULT " + json.dumps({"rank": 0, "losses": losses, "programs": compiled}))
