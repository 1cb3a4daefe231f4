"""The word-language-model family: the model of tests/user_code/lm_bptt.py (PyTorch's
word_language_model example cut down to embedding -> tanh(linear) -> linear decoder;
that script runs at import, so it is not imported), trained on slices
`source[i:i + BPTT]` of one batchified token stream, a new offset every step: the LM loop
of `bench shapes`."""
from __future__ import annotations

import torch

VOCAB, WIDTH, BPTT, BATCH = 50, 32, 12, 4   # lm_bptt.py's sizes


class WordLM(torch.nn.Module):
    def __init__(self, vocab: int = VOCAB, width: int = WIDTH):
        super().__init__()
        self.encoder = torch.nn.Embedding(vocab, width)
        self.hidden = torch.nn.Linear(width, width)
        self.decoder = torch.nn.Linear(width, vocab)

    def forward(self, x):
        return self.decoder(torch.tanh(self.hidden(self.encoder(x))))


def build(batches: int, seed: int = 0) -> tuple[torch.Tensor, WordLM]:
    """(source, model): a random token stream long enough for `batches` slices,
    batchified into BATCH columns (length x BATCH), and the model; both from `seed`."""
    torch.manual_seed(seed)
    stream = torch.randint(0, VOCAB, (BPTT * BATCH * (batches + 1) + 1,))
    source = stream[: stream.numel() // BATCH * BATCH].view(BATCH, -1).t().contiguous()
    return source, WordLM()
