"""The workloads the tools run, one home per family: a frozen spec (the sizes), a builder
(random weights on CPU, deterministic from the spec's seed), its batches and training step.

  decoder.py  HF Llama and Qwen2 causal LMs built from configs (`DecoderSpec`), and the
              same Llama in pure JAX: the demo, the benches, the GRPO loop, the examples;
  gpt.py      a nanoGPT-style GPT-2 (`GPTSpec`) and its JAX twin: `bench compile`, the demo;
  wordlm.py   the word language model of tests/user_code/lm_bptt.py: `bench shapes`;
  models.py   the trainable ones by name (`--model llama|gpt` of the demo, `bench compile`).

`offline()` is the one offline setting, called by whoever builds an HF model.
"""
from __future__ import annotations

import copy
import os


def offline() -> None:
    """transformers and huggingface_hub never reach the network: every model here is built
    from its config, with random weights. huggingface_hub reads the setting when it is
    first imported, so this runs before the first `import transformers`; a value the user
    set is kept."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def replicate(model, device: str):
    """The same initial weights on `device` (the CPU model itself is left untouched)."""
    return copy.deepcopy(model).to(device)
