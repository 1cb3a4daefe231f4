"""A plain PyTorch training loop over HF's dynamic-padding collators, written for CUDA: a
DataLoader whose collate_fn is `DataCollatorWithPadding` (a small BERT classifier) or
`DataCollatorForLanguageModeling` (the same BERT as a masked LM), AdamW, 2 epochs over
examples of 8-128 tokens. COLLATOR=padding|mlm picks one; FORCE_CPU=1 runs it on the CPU.

It prints one line, "RESULT {json}": the losses, each step's batch length, and on an
accelerator the programs it had built after each step.
"""
import json
import os
import tempfile

import torch
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification,
                          BertTokenizerFast, DataCollatorForLanguageModeling,
                          DataCollatorWithPadding)

device = "cpu" if os.environ.get("FORCE_CPU") == "1" else "cuda"
mlm = os.environ.get("COLLATOR", "padding") == "mlm"
vocab = os.path.join(tempfile.mkdtemp(prefix="plain_loop_"), "vocab.txt")
with open(vocab, "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]))
tokenizer = BertTokenizerFast(vocab_file=vocab)

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
lengths = (8 + 120 * torch.rand(96, generator=g) ** 4).long().tolist()
data = [{"input_ids": [2] + torch.randint(5, 100, (n - 2,), generator=g).tolist() + [3],
         **({} if mlm else {"labels": int(torch.randint(0, 2, (), generator=g))})}
        for n in lengths]
config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=128, pad_token_id=0,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
model = (BertForMaskedLM if mlm else BertForSequenceClassification)(config).to(device)
collate = (DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3) if mlm
           else DataCollatorWithPadding(tokenizer))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, collate_fn=collate,
                                     generator=torch.Generator().manual_seed(0))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def programs():
    if device == "cpu" or not hasattr(torch, "tpu"):
        return 0
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


losses, lengths, built = [], [], []
for epoch in range(2):
    torch.manual_seed(epoch)  # the MLM collator's masking draws from torch's CPU generator
    for batch in loader:
        lengths.append(batch["input_ids"].shape[1])
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        built.append(programs())
print("RESULT " + json.dumps({"rank": 0, "losses": losses, "lengths": lengths,
                              "programs": built}))
