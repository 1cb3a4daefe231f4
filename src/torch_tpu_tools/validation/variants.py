"""Real-config variants of the model zoo: the "thousands of models" axis.

Every causal-LM, masked-LM and sequence-classification type, from its default config (a
released checkpoint's), shrunk in depth and width only: 2 layers, at most 4 experts, and
at most HEADS attention heads of the config's own head dimension, every width scaled by
the same factor, so head ratios and the head dimension the kernels see are kept; the
vocabulary is capped at MAX_VOCAB (its rows cost memory, not coverage). Then one feature
that breaks backends at a time, where the config class has the field for it:

- the attention layout: multi-head, grouped-query (2 query heads a KV head), multi-query;
- a sliding window of 4 tokens (inputs are 8 long), on every layer of its kind;
- each RoPE scaling type: linear, dynamic NTK, YaRN, LongRoPE, Llama 3;
- MoE routing to 1 expert instead of 2;
- the other choice of tied embeddings; attention biases; MLP biases;
- bfloat16 weights and inputs.

A variant whose config class rejects it is "unsupported" and not counted. Each one that
builds runs the model sweep's check (models.check_model: forward and one AdamW training
step against float64) in the chosen mode.
"""
from __future__ import annotations

import copy

from . import shrink

HEADS = 4
MAX_VOCAB = 16384
WINDOW = 4
TASKS = ("causal-lm", "masked-lm", "seq-cls")


def _first(d: dict, pattern):
    return next((k for k, v in d.items() if pattern.match(k) and shrink._is_int(v)), None)


def _round8(x: float) -> int:
    return max(8, int(-(-x // 8) * 8))


def _keep_heads(d: dict) -> None:
    """At most HEADS heads of the same head dimension, every width and FFN size scaled
    by the same factor; KV heads keep their ratio to the query heads."""
    key = _first(d, shrink._HEADS)
    if key is None or d[key] <= HEADS:
        return
    heads, new = d[key], HEADS
    width = _first(d, shrink._WIDTH)
    if "head_dim" in d and d["head_dim"] is None and width is not None:
        d["head_dim"] = d[width] // heads  # the one the model derives today: keep it
    for k, v in list(d.items()):
        if shrink._HEADS.match(k) and shrink._is_int(v):
            d[k] = min(v, new)
        elif shrink._KV_HEADS.match(k) and shrink._is_int(v):
            d[k] = new if v >= heads else max(1, v * new // heads)
        elif shrink._WIDTH.match(k) and shrink._is_int(v) and v > 0:
            d[k] = v * new // heads if (v * new) % heads == 0 else _round8(v * new / heads)
        elif shrink._FFN.search(k) and shrink._is_int(v) and v > 0:
            d[k] = _round8(v * new / heads)


def _cap_vocab(d: dict) -> None:
    if shrink._is_int(d.get("vocab_size")) and d["vocab_size"] > MAX_VOCAB:
        d["vocab_size"] = MAX_VOCAB
        for k, v in list(d.items()):  # special tokens past the cap: the last row
            if k.endswith("_token_id") and shrink._is_int(v) and v >= MAX_VOCAB:
                d[k] = MAX_VOCAB - 1


def real_shrink(d: dict) -> dict:
    """A copy of config dict `d` shrunk in depth and width only (module doc)."""
    d = copy.deepcopy(d)
    _walk(d)
    return d


def _walk(d: dict) -> None:
    for v in d.values():
        if isinstance(v, dict):
            _walk(v)
    if not all(isinstance(k, str) for k in d):
        return
    shrink._layers(d, shrink.TINY["layers"])
    shrink._unset(d)  # what the default leaves to its checkpoint (shrink.py)
    shrink._experts(d)
    _keep_heads(d)
    _cap_vocab(d)


# ---------------------------------------------------------------- the variants
def _kv(n_of):
    def edit(d: dict) -> bool:
        heads, kv = _first(d, shrink._HEADS), _first(d, shrink._KV_HEADS)
        if heads is None or kv is None:
            return False
        want = n_of(d[heads])
        if want < 1 or d[heads] % want or d[kv] == want:
            return False
        d[kv] = want
        return True
    return edit


def _sliding(d: dict) -> bool:
    if "sliding_window" not in d:
        return False
    d["sliding_window"] = WINDOW
    if "use_sliding_window" in d:
        d["use_sliding_window"] = True
    if shrink._is_int(d.get("max_window_layers")):
        d["max_window_layers"] = 0
    kinds = d.get("layer_types")
    if isinstance(kinds, list) and kinds and "sliding_attention" not in kinds:
        d["layer_types"] = ["sliding_attention"] * len(kinds)
    return True


def _rope_dicts(d: dict) -> list:
    """The config's RoPE parameter dicts (one, or one per layer kind)."""
    rope = d.get("rope_parameters")
    if isinstance(rope, dict) and "rope_type" in rope:
        return [rope]
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) and "rope_type" in v
                                               for v in rope.values()):
        return list(rope.values())
    return []


def _rotary_half(d: dict) -> int | None:
    width, heads = _first(d, shrink._WIDTH), _first(d, shrink._HEADS)
    head = d.get("head_dim") if shrink._is_int(d.get("head_dim")) else \
        (d[width] // d[heads] if width and heads else None)
    if head is None:
        return None
    return int(head * (d.get("partial_rotary_factor") or 1.0)) // 2


def _rope(kind: str):
    def edit(d: dict) -> bool:
        ropes = _rope_dicts(d)
        if not ropes or any(r.get("rope_type") not in ("default", None) for r in ropes):
            return False  # a model that already scales keeps its own scheme
        long = int(d.get("max_position_embeddings") or 4096)
        extra = {"linear": {"factor": 2.0}, "dynamic": {"factor": 2.0},
                 "yarn": {"factor": 2.0, "original_max_position_embeddings": long // 2},
                 "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": max(long // 4, 16)}}
        if kind == "longrope":
            half = _rotary_half(d)
            if half is None:
                return False
            extra["longrope"] = {"short_factor": [1.0] * half, "long_factor": [2.0] * half,
                                 "original_max_position_embeddings": long // 2}
        for r in ropes:
            r.update(rope_type=kind, **extra[kind])
        return True
    return edit


def _top1(d: dict) -> bool:
    topk = _first(d, shrink._TOPK)
    if topk is None or _first(d, shrink._EXPERTS) is None or d[topk] == 1:
        return False
    d[topk] = 1
    return True


def _flip_tied(d: dict) -> bool:
    if not isinstance(d.get("tie_word_embeddings"), bool):
        return False
    d["tie_word_embeddings"] = not d["tie_word_embeddings"]
    return True


def _switch_on(field: str):
    def edit(d: dict) -> bool:
        if d.get(field) is not False:
            return False
        d[field] = True
        return True
    return edit


# name -> edit of the top-level config dict (True where the config has the field); the
# dtype variant edits nothing
VARIANTS = {
    "default": lambda d: True,
    "mha": _kv(lambda h: h),
    "gqa": _kv(lambda h: h // 2),
    "mqa": _kv(lambda h: 1),
    "sliding-window": _sliding,
    **{f"rope-{k}": _rope(k) for k in ("linear", "dynamic", "yarn", "longrope", "llama3")},
    "top1": _top1,
    "tied-flipped": _flip_tied,
    "attention-bias": _switch_on("attention_bias"),
    "mlp-bias": _switch_on("mlp_bias"),
    "bf16": lambda d: True,
}
DTYPES = {"bf16": "bfloat16"}


def _text_level(d: dict) -> dict:
    """The dict the variant edits: a composite config's text model, else the config."""
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(d.get(key), dict):
            return d[key]
    return d


def config_dict(default: dict, variant: str) -> dict | None:
    """The shrunk config dict of `variant`, or None where the config has no field for it."""
    d = real_shrink(default)
    return d if VARIANTS[variant](_text_level(d)) else None


def units(types: dict) -> list[tuple[str, str]]:
    """(model type, variant) for every type of TASKS and every variant."""
    return [(t, v) for t, (task, _) in types.items() if task in TASKS for v in VARIANTS]
