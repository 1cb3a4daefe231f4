"""The local files torchtitan's llama3 debug model reads, made on this machine: the
`c4_test` data set and the test tokenizer under `tests/assets/` of the run's working
directory (torchtitan opens both by paths relative to the working directory), and 0.2.2's
`debug_model.toml`. The wheels ship none of them, and nothing is fetched at run time.

The corpus is synthetic and deterministic (a seeded Zipf-like draw over made-up words), in
the layout `datasets.load_dataset(dir, split="train")` reads (JSON lines with a "text"
field, as torchtitan's own c4_test). The tokenizer is a BPE model trained on it with the
`tokenizers` library, under the debug model's vocabulary (2048), with the Llama 3 BOS/EOS
names in `tokenizer_config.json`.
"""
from __future__ import annotations

import json
import pathlib
import random

DOCS = 2000
VOCAB = 2000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

# torchtitan v0.2.2's llama3 debug_model.toml, verbatim (the 0.2.2 wheel does not ship it)
DEBUG_MODEL_TOML = pathlib.Path(__file__).with_name("torchtitan_debug_model.toml")


def _words(rng: random.Random, n: int) -> list[str]:
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words: list[str] = []
    seen = set()
    while len(words) < n:
        w = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def corpus(docs: int = DOCS, seed: int = 0) -> list[str]:
    """`docs` documents of 100-500 words, sentences of 4-16 words, the same on every call."""
    rng = random.Random(seed)
    words = _words(rng, 4000)
    weights = [1.0 / (i + 1) for i in range(len(words))]  # Zipf: a few words are common
    out = []
    for _ in range(docs):
        sentences, n = [], rng.randint(100, 500)
        while n > 0:
            k = min(n, rng.randint(4, 16))
            s = rng.choices(words, weights, k=k)
            sentences.append(" ".join(s).capitalize() + rng.choice(".!?"))
            n -= k
        out.append(" ".join(sentences))
    return out


def write(root: pathlib.Path) -> pathlib.Path:
    """Write tests/assets/{c4_test,tokenizer} and debug_model.toml under `root` (once; a
    second call finds them); returns `root`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    assets = root / "tests" / "assets"
    data, tok = assets / "c4_test" / "data.json", assets / "tokenizer"
    if not data.exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        tmp = data.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus()))
        tmp.rename(data)
    if not (tok / "tokenizer.json").exists():
        tok.mkdir(parents=True, exist_ok=True)
        tokenizer = Tokenizer(models.BPE(unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS],
                                      show_progress=False)
        tokenizer.train_from_iterator(corpus(), trainer=trainer)
        (tok / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": BOS, "eos_token": EOS}, indent=1))
        tokenizer.save(str(tok / "tokenizer.json"))
    toml = root / "debug_model.toml"
    if not toml.exists():
        toml.write_text(DEBUG_MODEL_TOML.read_text())
    return root
