"""HF generation as a user writes it for CUDA, with "cuda" changed to "tpu": a small Llama
built from a config (random weights), `model.generate()` at several lengths, each result
compared with the same call on CPU. Prints one JSON line per call with the programs the
call compiled (torch.tpu.compile_cache_stats), then a summary line.

  --mode strict | defer_and_fuse | static   (static: cache_implementation="static", which
                                            transformers compiles with torch.compile)
  --lengths 16,256,...   max_new_tokens of each call, in order
  --sample               do_sample with top-k/top-p/temperature, seeded per call, and a
                         streamer; compared with transformers' own loop on tpu
                         (TORCH_TPU_BUCKETED_GENERATE=0 for that call), since CPU's
                         generator draws other numbers
  --batch-eos            a batch of 2 prompts, one left-padded, with an EOS token that one
                         row reaches early; also returns the scores
  --all-eos              one prompt, with an EOS token it reaches at its 7th new token:
                         the call stops there, before max_new_tokens
  --min-new-tokens K     min_new_tokens=K (EOS barred before K new tokens), with --all-eos
  --min-length L         min_length=L, the same counted from the prompt's start
  --plain                no scores (--batch-eos) and no streamer (--sample): what the
                         captured decode step holds (the summary counts captured calls)
"""
import argparse
import json
import os

import torch
import transformers
from transformers.generation.streamers import BaseStreamer

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="strict")
parser.add_argument("--lengths", default="16")
parser.add_argument("--sample", action="store_true")
parser.add_argument("--batch-eos", action="store_true")
parser.add_argument("--all-eos", action="store_true")
parser.add_argument("--min-new-tokens", type=int)
parser.add_argument("--min-length", type=int)
parser.add_argument("--plain", action="store_true")
args = parser.parse_args()

import torch_tpu  # noqa: E402

torch_tpu.set_eager_mode("strict" if args.mode == "static" else args.mode)
config = transformers.LlamaConfig(
    vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=0)
torch.manual_seed(0)
cpu_model = transformers.LlamaForCausalLM(config).eval()
model = transformers.LlamaForCausalLM(config).eval()
model.load_state_dict(cpu_model.state_dict())
model.to("tpu")

g = torch.Generator().manual_seed(2)
prompt = torch.randint(1, 256, (2 if args.batch_eos else 1, 8), generator=g)
mask = torch.ones_like(prompt)
if args.batch_eos:
    prompt[1, :3] = 0
    mask[1, :3] = 0
extra = {"cache_implementation": "static"} if args.mode == "static" else {}
if args.sample:
    extra.update(do_sample=True, top_k=20, top_p=0.9, temperature=0.8)
else:
    extra.update(do_sample=False)
eos = None
if args.batch_eos:  # a token the first row produces at its 4th step
    first = cpu_model.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False)
    eos = int(first[0, -1])
    extra.update(eos_token_id=eos, return_dict_in_generate=True, output_scores=not args.plain)
if args.all_eos:  # the token the prompt's greedy continuation has 7th: every row stops
    eos = int(cpu_model.generate(prompt, attention_mask=mask, max_new_tokens=7, do_sample=False)[0, -1])
    extra.update(eos_token_id=eos)
if args.min_new_tokens is not None:
    extra.update(min_new_tokens=args.min_new_tokens)
if args.min_length is not None:
    extra.update(min_length=args.min_length)


def programs():
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


class Collect(BaseStreamer):
    """A streamer that keeps what it is given (the prompt, then one token per step)."""

    def __init__(self):
        self.tokens = []

    def put(self, value):
        self.tokens += value.flatten().tolist()

    def end(self):
        self.tokens.append("end")


def generate(m, device, n):
    """-> (output, programs the generate call compiled, what a streamer got (--sample));
    the seeding and uploads before the call are the caller's work, synchronized before
    counting."""
    torch.manual_seed(n)
    ids, attention = prompt.to(device), mask.to(device)
    if device == "tpu":
        torch.tpu.synchronize()
    streamer = Collect() if args.sample and not args.plain else None
    before = programs()
    out = m.generate(ids, attention_mask=attention, max_new_tokens=n, pad_token_id=0,
                     streamer=streamer, **extra)
    return out, programs() - before, streamer and streamer.tokens


for n in [int(x) for x in args.lengths.split(",")]:
    out, compiled, streamed = generate(model, "tpu", n)
    seqs = (out.sequences if args.batch_eos else out).cpu()
    if args.sample:
        os.environ["TORCH_TPU_BUCKETED_GENERATE"] = "0"
        ref, _, ref_streamed = generate(model, "tpu", n)
        ref = ref.cpu()
        del os.environ["TORCH_TPU_BUCKETED_GENERATE"]
    else:
        ref_out = generate(cpu_model, "cpu", n)[0]
        ref = ref_out.sequences if args.batch_eos else ref_out
    row = {"new_tokens": n, "programs": compiled, "shape": list(seqs.shape),
           "equal": torch.equal(seqs, ref)}
    if args.sample and not args.plain:  # streamed: the prompt, each token, the end; as transformers' loop does
        row["equal"] &= streamed == ref_streamed == seqs[0].tolist() + ["end"]
    if args.batch_eos and not args.plain:
        got = torch.stack([s.cpu() for s in out.scores])
        want = torch.stack(ref_out.scores)
        finite = torch.isfinite(want)
        row["scores_close"] = bool(torch.equal(finite, torch.isfinite(got)) and torch.allclose(
            got[finite], want[finite], atol=1e-4, rtol=1e-4))
    if args.batch_eos:
        row["eos_rows"] = int((seqs == eos).any(dim=1).sum())
    print(json.dumps(row), flush=True)

from torch_tpu import metrics  # noqa: E402
from torch_tpu._integrations import generation  # noqa: E402

print(json.dumps({"bucketed": metrics.counters.get("generate_bucketed", 0),
                  "captured": metrics.counters.get("generate_captured", 0),
                  "reused": metrics.counters.get("generate_capture_reused", 0),
                  "replays": metrics.counters.get("graphs.replays", 0),
                  "compiled_programs": torch.tpu.compile_cache_stats(
                      programs=False, disk=False)["kinds"]["compiled"]["xla_compiles"],
                  "unbucketed": generation.unbucketed_reasons(),
                  "uncaptured": generation.uncaptured_reasons()}), flush=True)
