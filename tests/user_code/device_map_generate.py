"""Big-model loading as a CUDA user writes it: `from_pretrained(..., device_map=...)`
(accelerate's placement), then generate(). A small random Llama is saved and reloaded;
every placement must put the weights on the devices (never silently on the CPU) and
generate the CPU's tokens; with several devices, limits spread the layers over them. Prints one `RESULT {json}` line."""
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
count = torch.accelerator.device_count()
cases = [("auto", "auto", None), ("balanced", "balanced", None), ("index", {"": count - 1}, None),
         ("auto_limits", "auto", {0: "2GiB", "cpu": "4GiB"})]
if count > 1:  # limits that leave a layer or two per device: the model spread over them
    cases.append(("split", "auto", {**{i: "120KB" for i in range(count - 1)}, count - 1: "1GB"}))
out = {"count": count}
for name, device_map, max_memory in cases:
    model = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map,
                                                 max_memory=max_memory)
    tokens = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False)
    out[name] = {"devices": sorted({str(p.device) for p in model.parameters()}),
                 "same_tokens": torch.equal(tokens.cpu(), reference)}
try:
    AutoModelForCausalLM.from_pretrained(folder, device_map="auto", max_memory={count: "1GiB"})
    out["other_index"] = "loaded"
except ValueError as e:
    out["other_index"] = str(e)
print("RESULT " + json.dumps(out))
