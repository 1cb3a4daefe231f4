"""HF generation as a user writes it for CUDA, with "cuda" made "tpu": a small Llama with two
LoRA adapters (PEFT), `generate()` called again and again while the user changes things
between calls (a parameter updated in place, a parameter replaced, the processors, the
active adapter, adapters disabled, another model). Each call is compared with the same call
on CPU, and prints one JSON line: whether tpu's tokens equal CPU's, and whether the call
captured its decode step anew or replayed the one an earlier call captured."""
import copy
import json
import os
import sys

import torch
import transformers

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import peft  # noqa: E402

import torch_tpu  # noqa: E402
from torch_tpu import metrics  # noqa: E402

torch_tpu.set_eager_mode(sys.argv[1] if len(sys.argv) > 1 else "defer_and_fuse")
config = transformers.LlamaConfig(
    vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=0)
torch.manual_seed(0)


def lora_model():
    base = transformers.LlamaForCausalLM(config).eval()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(base, lora, adapter_name="a")
    model.add_adapter("b", lora)
    with torch.no_grad():  # LoRA's B starts at zero: give both adapters an effect
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)
    return model.eval()


cpu = lora_model()
tpu = copy.deepcopy(cpu).to("tpu")
other_cpu = transformers.LlamaForCausalLM(config).eval()
other_tpu = copy.deepcopy(other_cpu).to("tpu")
prompt = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(2))


def generate(model, device, **kw):
    ids = prompt.to(device)
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                          pad_token_id=0, **kw).cpu()


def call(what, cpu_model, tpu_model, **kw):
    before = dict(metrics.counters)
    torch.manual_seed(0)
    want = generate(cpu_model, "cpu", **kw)
    torch.manual_seed(0)
    got = generate(tpu_model, "tpu", **kw)
    grew = {k: metrics.counters.get(k, 0) - before.get(k, 0)
            for k in ("generate_captured", "generate_capture_reused")}
    print(json.dumps({"call": what, "equal": torch.equal(got, want),
                      "captured": grew["generate_captured"],
                      "reused": grew["generate_capture_reused"]}), flush=True)
    return got


def both(fn):
    for m in (cpu, tpu):
        with torch.no_grad():
            fn(m)


call("first", cpu, tpu)
call("again", cpu, tpu)
both(lambda m: m.base_model.model.lm_head.weight.mul_(-1))
call("parameter updated in place", cpu, tpu)
first = call("again after the update", cpu, tpu)[0, 8].item()
call("suppress_tokens", cpu, tpu, suppress_tokens=[first])
call("suppress_tokens again", cpu, tpu, suppress_tokens=[first])
call("suppress_tokens changed", cpu, tpu, suppress_tokens=[first, first + 1])
call("sampling, top_k 1, temperature 0.7", cpu, tpu, do_sample=True, top_k=1, temperature=0.7)
call("temperature 1.3", cpu, tpu, do_sample=True, top_k=1, temperature=1.3)
call("plain", cpu, tpu)
for m in (cpu, tpu):
    m.set_adapter("b")
call("adapter b", cpu, tpu)
call("adapter b again", cpu, tpu)
with cpu.disable_adapter(), tpu.disable_adapter():
    call("adapters disabled", cpu, tpu)
call("adapter b after", cpu, tpu)
for m in (cpu, tpu):  # a parameter replaced, as a user loads a new head
    head = m.base_model.model.lm_head
    head.weight = torch.nn.Parameter(head.weight.detach().flip(0).contiguous())
call("parameter replaced", cpu, tpu)
call("another model", other_cpu, other_tpu)
call("another model again", other_cpu, other_tpu)
call("first model again", cpu, tpu)
