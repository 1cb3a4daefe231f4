"""Real clients whose shapes vary, written as their users write them: what
`python -m torch_tpu bench shapes --clients` times, each in a fresh process.

  trainer     HF Trainer fine-tuning a small BERT classifier, HF's default
              `DataCollatorWithPadding` (each batch padded to its longest example), 96
              examples of 8-128 tokens, batch 8, 2 epochs: 15-18 distinct lengths;
  trainer_max the same, every batch padded to 128 (`padding="max_length"`, the user's
              manual fix): the reference the bucketed run is held against;
  grpo        TRL's GRPOTrainer on a tiny Llama, completions of up to 6 tokens that end at
              their own lengths, 12 steps (the warm median over steps 3-12);
  generate16, generate128
              nanoGPT's `generate` (a model call on the last block of tokens, top-k,
              `torch.multinomial`, `torch.cat` of the new token: no host sync) of 16 or 32
              tokens from an 8-token prompt, on the GPT of workloads/gpt.py;
  first_step  the first training step (forward, backward, AdamW, the loss read) of a
              small Llama (hidden 128, 4 layers) in a fresh process.

`run(name, device)` returns seconds and counts: `first_s` (the first step or call,
compiles included), `warm_s` (the median step that built no program), `wall_s`, and on
tpu `programs` (compiled, or loaded from the persistent cache) and `late_programs` (built
after the warm-up the client states). The process imports torch_tpu only for "tpu" (the
CPU baseline runs with the device hidden: TORCH_DEVICE_BACKEND_AUTOLOAD=0,
ACCELERATE_USE_CPU=1, set by the caller). `python -m torch_tpu_tools.workloads.clients
NAME DEVICE` prints "RESULT {json}".
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from . import offline

NAMES = ("trainer", "trainer_max", "grpo", "generate16", "generate128", "first_step")


def _programs() -> int:
    import torch

    if not hasattr(torch, "tpu"):
        return 0
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["xla_compiles"] + k["disk_hits"] for k in kinds.values())


def _steps_callback():
    """A TrainerCallback recording each step's seconds and the programs held after it."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def __init__(self):
            self.seconds, self.programs, self.t0 = [], [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.t0)
            self.programs.append(_programs())

    return Steps()


def _summary(steps, warm_from: int, wall_s: float) -> dict:
    """First step, median warm step (steps that built no program), programs after warm-up."""
    built = [b - a for a, b in zip([0] + steps.programs, steps.programs)]
    warm = [s for s, n in zip(steps.seconds[1:], built[1:]) if n == 0] or steps.seconds[1:]
    return {"first_s": steps.seconds[0], "warm_s": statistics.median(warm), "wall_s": wall_s,
            "steps": len(steps.seconds), "programs": steps.programs[-1],
            "late_programs": steps.programs[-1] - steps.programs[warm_from - 1]}


def trainer(max_length: int | None) -> dict:
    import torch
    from transformers import (BertConfig, BertForSequenceClassification, BertTokenizerFast,
                              DataCollatorWithPadding, Trainer, TrainingArguments)

    out = tempfile.mkdtemp(prefix="bench_trainer_")
    vocab = os.path.join(out, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                          + [f"w{i}" for i in range(95)]))
    tokenizer = BertTokenizerFast(vocab_file=vocab)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    lengths = (8 + 120 * torch.rand(96, generator=g) ** 4).long().tolist()
    train = [{"input_ids": [2] + torch.randint(5, 100, (n - 2,), generator=g).tolist() + [3],
              "label": int(torch.randint(0, 2, (), generator=g))} for n in lengths]
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                        pad_token_id=0)
    padding = {"padding": "max_length", "max_length": max_length} if max_length else {}
    steps = _steps_callback()
    args = TrainingArguments(output_dir=out, num_train_epochs=2, per_device_train_batch_size=8,
                             learning_rate=1e-3, logging_steps=1, save_strategy="no",
                             report_to="none", disable_tqdm=True, seed=0, data_seed=0)
    run = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=train,
                  data_collator=DataCollatorWithPadding(tokenizer, **padding),
                  processing_class=tokenizer, callbacks=[steps])
    t0 = time.perf_counter()
    run.train()
    return _summary(steps, len(steps.seconds) // 2 + 1, time.perf_counter() - t0)


def grpo() -> dict:
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    out = tempfile.mkdtemp(prefix="bench_grpo_")
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(14)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                        eos_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    g = torch.Generator().manual_seed(1)
    prompts = [" ".join(f"w{int(i)}" for i in torch.randint(4, 14, (4,), generator=g))
               for _ in range(32)]
    args = GRPOConfig(output_dir=out, max_steps=12, per_device_train_batch_size=16,
                      num_generations=8, max_completion_length=6, learning_rate=2e-2,
                      temperature=1.0, top_k=12, logging_steps=1, seed=0, bf16=False,
                      save_strategy="no", report_to="none", disable_tqdm=True)
    steps = _steps_callback()
    run = GRPOTrainer(model=out, args=args, processing_class=tokenizer, callbacks=[steps],
                      reward_funcs=lambda completions, **kw: [c.split().count("w3") / 6
                                                              for c in completions],
                      train_dataset=Dataset.from_dict({"prompt": prompts}))
    t0 = time.perf_counter()
    run.train()
    return _summary(steps, 3, time.perf_counter() - t0)


def generate(device: str, tokens: int) -> dict:
    """nanoGPT's sampling loop, as its model.py writes it."""
    import torch

    from .gpt import GPTSpec, build_model

    spec = GPTSpec(layers=2, width=64, heads=4, block=64)
    model = build_model(spec).eval().to(device)
    torch.manual_seed(0)
    idx = torch.randint(0, spec.vocab, (1, 8), device=device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(tokens):
            cond = idx if idx.size(1) <= spec.block else idx[:, -spec.block:]
            logits, _ = model(cond)
            logits = logits[:, -1, :] / 0.8
            v, _ = torch.topk(logits, 10)
            logits[logits < v[:, [-1]]] = -float("inf")
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, nxt), dim=1)
    idx.cpu()
    wall = time.perf_counter() - t0
    out = {"first_s": wall, "wall_s": wall, "tokens": tokens, "programs": _programs()}
    if device == "tpu":
        out["compile_s"] = torch.tpu.compile_cache_stats(programs=False, disk=False)[
            "compile_seconds"]
    return out


def first_step(device: str) -> dict:
    from . import decoder

    spec = decoder.DecoderSpec(hidden=128, layers=4, heads=4, kv_heads=2, vocab=256, seq=64,
                               batch=4)
    t0 = time.perf_counter()
    model = decoder.build_model(spec).to(device)
    opt = decoder.make_optimizer(model, spec)
    ids = decoder.random_batches(spec, [spec.seq])[0]
    start = time.perf_counter() - t0
    t1 = time.perf_counter()
    decoder.train_step(model, opt, ids.to(device)).item()
    first = time.perf_counter() - t1
    return {"first_s": first, "start_s": start, "programs": _programs()}


def run(name: str, device: str) -> dict:
    offline()
    if device == "tpu":
        import torch_tpu  # noqa: F401  (registers the device; the mode comes from the env)
    if name in ("trainer", "trainer_max"):
        return trainer(128 if name == "trainer_max" else None)
    if name == "grpo":
        return grpo()
    if name.startswith("generate"):
        return generate("tpu" if device == "tpu" else "cpu", int(name[len("generate"):]))
    if name == "first_step":
        return first_step(device)
    raise ValueError(f"unknown client {name!r}; one of {', '.join(NAMES)}")


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(sys.argv[1], sys.argv[2])))  # (bench/common.RESULT)
