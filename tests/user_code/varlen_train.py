"""Training on batches of many lengths, as a user writes it for CUDA ("cuda" made "tpu"):
a small HF Llama from a config (random weights), AdamW, 50 steps on batches whose lengths
are drawn from 16..512. On tpu the collated batch is padded to its length's bucket
(`torch_tpu.pad_to_bucket`: pad tokens, mask 0, labels -100); on CPU it is not.

Environment: DEVICE (cpu | tpu), COMPILE=1 for torch.compile(model), STEPS, and the
eager mode through TORCH_TPU_DEFER_AND_FUSE. Prints `RESULT {json}`: per step the loss, the
gradient norm, the padded length and the programs that step compiled.
"""
import json
import os

import torch
import transformers

DEVICE = os.environ.get("DEVICE", "tpu")
STEPS = int(os.environ.get("STEPS", "50"))
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
    attn_implementation="sdpa", pad_token_id=0)
model = transformers.LlamaForCausalLM(config).to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
forward = torch.compile(model) if os.environ.get("COMPILE") == "1" else model

g = torch.Generator().manual_seed(1)
lengths = torch.randint(16, 513, (STEPS,), generator=g).tolist()


def programs():
    if DEVICE == "cpu":
        return 0
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


def collate(n):
    ids = torch.randint(1, 128, (2, n), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if DEVICE == "tpu":
        import torch_tpu

        batch = torch_tpu.pad_to_bucket(batch)
    return {k: v.to(DEVICE) for k, v in batch.items()}


rows = []
for n in lengths:
    before = programs()
    batch = collate(n)
    loss = forward(**batch).loss
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    opt.step()
    opt.zero_grad(set_to_none=True)
    rows.append({"length": n, "padded": batch["input_ids"].shape[1], "loss": loss.item(),
                 "grad_norm": norm.item(), "programs": programs() - before})
print("RESULT " + json.dumps({"rank": 0, "steps": rows}), flush=True)
