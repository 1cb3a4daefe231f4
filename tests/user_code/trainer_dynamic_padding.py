"""HF Trainer fine-tuning a small BERT classifier the way HF's examples do: a tokenizer, the
default `DataCollatorWithPadding` (each batch padded to its own longest example), examples
of 8-128 tokens, 2 epochs. No device is named: Trainer trains on the accelerator, or on the
CPU when it is hidden (TORCH_DEVICE_BACKEND_AUTOLOAD=0, ACCELERATE_USE_CPU=1).

It prints one line, "RESULT {json}": the training losses, the distinct batch lengths the
collator made in each epoch, and on an accelerator the programs it had built at the end of
each epoch.
"""
import json
import os
import tempfile

import torch
from transformers import (BertConfig, BertForSequenceClassification, BertTokenizerFast,
                          DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments)

out_dir = tempfile.mkdtemp(prefix="trainer_padding_")
vocab = os.path.join(out_dir, "vocab.txt")
with open(vocab, "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]))
tokenizer = BertTokenizerFast(vocab_file=vocab)

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
lengths = (8 + 120 * torch.rand(96, generator=g) ** 4).long().tolist()  # mostly short, as text is
train = [{"input_ids": [2] + torch.randint(5, 100, (n - 2,), generator=g).tolist() + [3],
          "label": int(torch.randint(0, 2, (), generator=g))} for n in lengths]

config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=128, pad_token_id=0,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # comparable to CPU
model = BertForSequenceClassification(config)

collate = DataCollatorWithPadding(tokenizer)
seen = [set()]  # the batch lengths the collator made, per epoch


def counting_collator(features):
    batch = collate(features)
    seen[-1].add(batch["input_ids"].shape[1])
    return batch


def programs():
    if not hasattr(torch, "tpu"):
        return 0
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


class Epochs(TrainerCallback):
    def __init__(self):
        self.programs = []

    def on_epoch_end(self, args, state, control, **kwargs):
        self.programs.append(programs())
        seen.append(set())


epochs = Epochs()
args = TrainingArguments(output_dir=out_dir, num_train_epochs=2, per_device_train_batch_size=8,
                         learning_rate=1e-3, logging_steps=1, save_strategy="no",
                         report_to="none", disable_tqdm=True, seed=0, data_seed=0)
trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=counting_collator,
                  processing_class=tokenizer, callbacks=[epochs])
trainer.train()
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
print("RESULT " + json.dumps({"rank": 0, "losses": losses,
                              "lengths": [sorted(s) for s in seen if s],
                              "programs": epochs.programs,
                              "device": str(next(model.parameters()).device)}))
