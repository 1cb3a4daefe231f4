"""Big-model loading as a CUDA user writes it: `from_pretrained(..., device_map=...)`
(accelerate's placement), then generate(). A small random Llama is saved and reloaded;
every placement must put the weights on the device (never silently on the CPU) and
generate the CPU's tokens. Prints one `RESULT {json}` line."""
import json
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
folder = tempfile.mkdtemp()
LlamaForCausalLM(cfg).save_pretrained(folder)
ids = torch.tensor([[1, 5, 9, 17, 33]])
reference = AutoModelForCausalLM.from_pretrained(folder).generate(ids, max_new_tokens=8,
                                                                  do_sample=False)
out = {}
for name, device_map, max_memory in [("auto", "auto", None), ("balanced", "balanced", None),
                                     ("index", {"": 0}, None),
                                     ("auto_limits", "auto", {0: "2GiB", "cpu": "4GiB"})]:
    model = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map,
                                                 max_memory=max_memory)
    tokens = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False)
    out[name] = {"devices": sorted({str(p.device) for p in model.parameters()}),
                 "same_tokens": torch.equal(tokens.cpu(), reference)}
try:
    AutoModelForCausalLM.from_pretrained(folder, device_map="auto", max_memory={1: "1GiB"})
    out["other_index"] = "loaded"
except ValueError as e:
    out["other_index"] = str(e)
print("RESULT " + json.dumps(out))
