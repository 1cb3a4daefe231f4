"""The generic config shrinker of the model sweep: any transformers config, made tiny.

It works on the config's dict (sub-configs are nested dicts) and rebuilds the config from
it, so whatever `__init__` derives from the sizes is derived again (attributes it derives
are dropped for that). Relations between sizes that the shrinking broke are restored where
they held (`_consistent`), and what a default config leaves to its checkpoint is filled in
(`_unset`). Five levels, tried in order until the model runs on CPU (models.py does that):

- "tiny": every size field set to one small shape (width 64, 4 heads of 16, 2 layers,
  FFN 128, 4 experts choosing 2), which the attention code's divisibility rules accept;
- "tiny64", "tiny128": the same with 2 heads of 64 (of 128), for code that hard-codes
  the rotary split of a wider head (multimodal RoPE sections, fixed rotary dims);
- "scaled": width fields divided by one common factor (up to 16), head counts kept, so
  every ratio and divisibility the architecture relies on survives; 2 layers;
- "layers": only the depth fields (2 layers, 1 block a stage) and expert counts.

Vocabularies, image and audio geometry, and special-token ids are left alone: multimodal
models put their special tokens at the top of the vocabulary and check image/patch
arithmetic, and neither costs much at 2 layers.
"""
from __future__ import annotations

import copy
import dataclasses
import re

LEVELS = ("tiny", "tiny64", "tiny128", "scaled", "layers")

_LAYERS = re.compile(r"^(num_hidden_layers|num_layers|n_layers?|encoder_layers|decoder_layers|"
                     r"num_encoder_layers|num_decoder_layers|depth|decoder_num_layers|"
                     r"num_hidden_blocks|text_layers|vision_layers|num_blocks|"
                     r"memory_attention_num_layers|memory_fuser_num_layers|resampler_depth|"
                     r"num_lstm_layers|decoder_depth|encoder_depth|num_adapter_layers|"
                     r"num_self_attends_per_block)$")
_DEPTH_LISTS = re.compile(r"^(depths|blocks_per_stage|stage_num_blocks|"
                          r"stage_numb_of_layers|num_res_blocks|layers)$")
_WIDTH = re.compile(r"^(hidden_size|d_model|n_embd|n_embed|embed_dim|dim|hidden_dim|"
                    r"embedding_size|embedding_dim|model_dim|d_embed|word_embed_proj_dim|"
                    r"projection_dim|proj_dim|text_embed_dim|vision_embed_dim|"
                    r"encoder_hidden_size|decoder_hidden_size|text_hidden_size|"
                    r"out_hidden_size|projector_hidden_size|output_hidden_size|d_inner|"
                    r"hidden_sizes|embed_dims|dims|embed_dim_per_stage|conv_dim|"
                    r"decoder_hidden_dim|encoder_hidden_dim|query_dim|latent_dim|"
                    r"vision_hidden_size|audio_hidden_size|hidden_size_per_layer_input|codebook_dim|emb_dim|d_latents|"
                    r"mamba_d_ssm|fpn_hidden_size|"
                    r"output_embedding_size|input_embedding_size|entity_emb_size)$")
_FFN = re.compile(r"(intermediate_size|ffn_dim|^d_ff$|^n_inner$|mlp_dim|ffn_hidden_size|"
                  r"dim_feedforward|^linear_units$|decoder_intermediate_size)")
_HEAD_DIM = re.compile(r"^(head_dim|kv_channels|d_kv|attention_head_dim|qk_nope_head_dim|"
                       r"qk_rope_head_dim|v_head_dim|dim_head|linear_key_head_dim|"
                       r"linear_value_head_dim|index_head_dim|swa_head_dim|mamba_d_head|"
                       r"linear_head_dim|attention_head_size|rotary_dim)$")
_LORA = re.compile(r"^(kv_lora_rank|q_lora_rank)$")
_HEADS = re.compile(r"^(num_attention_heads|n_head|num_heads|encoder_attention_heads|"
                    r"decoder_attention_heads|n_heads|attention_heads|"
                    r"decoder_num_attention_heads|swa_num_attention_heads|index_n_heads|"
                    r"linear_num_value_heads|linear_num_heads|mamba_n_heads)$")
_KV_HEADS = re.compile(r"^(num_key_value_heads|num_kv_heads|n_kv_heads|multi_query_group_num|"
                       r"swa_num_key_value_heads|linear_num_key_heads)$")
# side vocabularies no input of the harness reaches (entities, hashed byte groups)
_SIDE_VOCABS = re.compile(r"^(entity_vocab_size|encoder_hash_byte_group_vocab)$")
# first channels of a conv stack that multiplies them at each downsampling: audio codecs'
# (VibeVoice: up to 64x) and VQ image tokenizers' (Apertus; 32 is GroupNorm's group count)
_BASE_CHANNELS = {"num_filters": 8, "base_channels": 32}
_EXPERTS = re.compile(r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts)$")
_TOPK = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk|moe_k|top_k_experts)$")
# lists of layer indices: kept where they still name a layer
_LAYER_INDEX_LISTS = re.compile(r"^(global_attn_indexes|deepstack_visual_indexes|"
                                r"fullatt_block_indexes|mlp_only_layers|no_rope_layers|"
                                r"full_attn_idxs|attn_layer_indices|intermediate_layers_indices)$")

TINY = dict(width=64, ffn=128, head_dim=16, heads=4, kv_heads=2, layers=2, experts=4, topk=2,
            lora=32)
TINY64 = dict(TINY, width=128, ffn=256, head_dim=64, heads=2, kv_heads=1, lora=64)
TINY128 = dict(TINY, width=256, ffn=256, head_dim=128, heads=2, kv_heads=1, lora=64)
_SIZES = {"tiny": TINY, "tiny64": TINY64, "tiny128": TINY128}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_int(x) for x in v)


def _old_layers(d: dict):
    for k, v in d.items():
        if _LAYERS.match(k) and _is_int(v):
            return v
    return None


def _index_keyed(v) -> bool:
    """A dict of per-layer settings keyed by layer index ({"05": {...}})."""
    return (isinstance(v, dict) and bool(v) and
            all(isinstance(k, int) or (isinstance(k, str) and k.isdigit()) for k in v))


def _per_layer_indices(d: dict, old: int, n: int) -> list[int]:
    """The layers to keep: the first `n`, plus the first layer of every kind that a
    per-layer list (layer_types and the like) or per-layer dict names, so a hybrid model
    keeps each kind."""
    keep = set(range(n))
    for k, v in d.items():
        if _index_keyed(v):
            keep.add(min(int(i) for i in v))
        if isinstance(v, list) and len(v) == old and not _DEPTH_LISTS.match(k) and \
                k != "kv_source_layers":
            try:
                firsts = {}
                for i, x in enumerate(v):
                    firsts.setdefault(x, i)
            except TypeError:  # unhashable entries (dicts of per-layer settings)
                continue
            if len(firsts) <= 8:
                keep |= set(firsts.values())
    return sorted(keep)


def _layers(d: dict, n: int) -> None:
    """Depth fields to `n` (more for a hybrid), and the per-layer lists that follow them."""
    old = _old_layers(d)
    stages = {len(v) for k, v in d.items() if _DEPTH_LISTS.match(k) and _int_list(v)}
    if old in stages:  # Swin's num_layers counts its stages, len(depths), which stay
        old = None
    keep = _per_layer_indices(d, old, n) if old is not None and old > n else None
    for k, v in list(d.items()):
        if _LAYERS.match(k) and _is_int(v) and v > n and v not in stages:
            d[k] = len(keep) if keep is not None and v == old else n
        elif _DEPTH_LISTS.match(k) and _int_list(v):
            d[k] = [min(x, 1) for x in v]
        elif _LAYER_INDEX_LISTS.match(k) and _int_list(v):
            m = len(keep) if keep is not None else n
            remap = {old_i: new_i for new_i, old_i in enumerate(keep)} if keep else {}
            kept = [remap.get(x, x) for x in v if x in remap or (not keep and x < m)]
            d[k] = kept or [m - 1]
        elif keep is not None and k == "kv_source_layers" and len(v or ()) == old:
            new = {old_i: new_i for new_i, old_i in enumerate(keep)}  # layer indices: remapped
            d[k] = [new.get(v[i], new_i) for new_i, i in enumerate(keep)]  # or its own
        elif keep is not None and isinstance(v, list) and len(v) == old:
            d[k] = [v[i] for i in keep]  # layer_types, attention_window, block_configs, ...
        elif k == "block_types" and isinstance(v, list):  # a cycle (Recurrent Gemma): each
            d[k] = list(dict.fromkeys(v))  # kind once, so that the kept layers have them all
        elif keep is not None and _index_keyed(v):
            new = {old_i: new_i for new_i, old_i in enumerate(keep)}
            d[k] = {str(new[int(i)]): x for i, x in v.items() if int(i) in new}
    idx = d.get("out_indices")
    if keep is not None and not (_int_list(idx) and max(idx) <= max(stages, default=-1)):
        # a backbone's stages are its layers: let __init__ derive the outputs again (a
        # depth list keeps its stages, and the detectors' feature maps with them)
        for k in ("out_features", "out_indices", "stage_names"):
            d.pop(k, None)
    if _is_int(d.get("first_k_dense_replace")):
        d["first_k_dense_replace"] = min(d["first_k_dense_replace"], 1)
    if _is_int(d.get("num_kv_shared_layers")):
        d["num_kv_shared_layers"] = 0
    if _is_int(d.get("num_layers_per_stack")):  # HRM: __post_init__ splits the depth again
        d["num_layers_per_stack"] = None
    if _is_int(d.get("vision_feature_layer")) and d["vision_feature_layer"] >= n:
        d["vision_feature_layer"] = -1
    elif _int_list(d.get("vision_feature_layer")):  # Molmo2's adapter: clamp into the tower
        d["vision_feature_layer"] = [max(-n, min(x, n - 1)) for x in d["vision_feature_layer"]]
    for k in list(d):  # Jamba's attention every 8th layer from the 4th: one of the kept
        if k.endswith("_layer_offset") and _is_int(d[k]) and d[k] >= n:
            d[k] = n - 1
        elif re.match(r"num_sparse_\w+_layers$", k) and _is_int(d[k]):  # Switch: 1 of 2
            d[k] = min(d[k], 1)
    if _is_int(d.get("max_window_layers")):
        d["max_window_layers"] = min(d["max_window_layers"], n)


def _experts(d: dict) -> None:
    if (any(_EXPERTS.match(k) for k in d) and any(_TOPK.match(k) for k in d) and
            all(d[k] is None for k in d if _TOPK.match(k))):
        # a default config that leaves the routing to the checkpoint: route 2 of 4 experts
        for k in d:
            if _TOPK.match(k):
                d[k] = TINY["topk"]
            elif _EXPERTS.match(k) and d[k] is None:
                d[k] = TINY["experts"]
        if "n_shared_experts" in d and d["n_shared_experts"] is None:
            d["n_shared_experts"] = 1
        if "moe_intermediate_size" in d and d["moe_intermediate_size"] is None:
            d["moe_intermediate_size"] = TINY["ffn"]  # Diffusion Gemma's experts
    for k, v in list(d.items()):
        if _EXPERTS.match(k) and _is_int(v) and v > TINY["experts"]:
            d[k] = TINY["experts"]
        elif _TOPK.match(k) and _is_int(v) and v > TINY["topk"]:
            d[k] = TINY["topk"]
    for k in ("n_group", "num_expert_group", "topk_group"):
        if _is_int(d.get(k)):
            d[k] = 1
    if _is_int(d.get("n_shared_experts")):
        d["n_shared_experts"] = min(d["n_shared_experts"], 1)


def _tiny(d: dict, size: dict) -> None:
    heads = None
    for k, v in list(d.items()):
        if _HEADS.match(k) and _is_int(v):
            heads = v if heads is None else heads
            d[k] = min(v, size["heads"])
        elif _HEADS.match(k) and _int_list(v):  # per stage (Swin): powers of 2 divide widths
            d[k] = [min(1 << (x.bit_length() - 1), size["heads"]) for x in v]
    for k, v in list(d.items()):
        if _WIDTH.match(k):
            if _is_int(v) and v > size["width"]:
                d[k] = size["width"]
            elif _int_list(v):
                d[k] = [min(x, size["width"] * 2 ** i) for i, x in enumerate(v)]
        elif _FFN.search(k) and _is_int(v) and v > size["ffn"]:
            d[k] = size["ffn"]
        elif _HEAD_DIM.match(k) and _is_int(v) and v > size["head_dim"]:
            d[k] = size["head_dim"]
        elif _LORA.match(k) and _is_int(v) and v > size["lora"]:
            d[k] = size["lora"]
        elif k in _BASE_CHANNELS and _is_int(v):
            d[k] = min(v, _BASE_CHANNELS[k])
        elif _KV_HEADS.match(k) and _is_int(v):
            # multi-head stays multi-head; grouped-query stays grouped
            d[k] = size["heads"] if heads is not None and v >= heads else min(v, size["kv_heads"])
    if _is_int(d.get("qk_head_dim")) and _is_int(d.get("qk_nope_head_dim")):
        d["qk_head_dim"] = d["qk_nope_head_dim"] + (d.get("qk_rope_head_dim") or 0)


_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim")
# default to the width (RWKV's attention, Recurrent Gemma's LRU, adapters fed the hidden
# state, Mimi's depthwise upsampling groups): where they equalled it, they follow it
_FOLLOWS_WIDTH = re.compile(r"^(attention_hidden_size|lru_width|\w+_in_dim|adapter_input_size|"
                            r"pooler_hidden_size|pooler_output_size|projection_size|"
                            r"upsample_groups)$")
# a tower's output into the language model (dots.llm3's adapters, CSM's depth decoder)
_FOLLOWS_TEXT = re.compile(r"^(adapter_out_dim|out_hidden_size|text_hidden_size|"
                           r"output_hidden_size|projector_hidden_size|backbone_hidden_size)$")


def _width(d: dict):
    return next((k for k in _WIDTH_KEYS if _is_int(d.get(k))), None)


def _consistent(d: dict, orig: dict) -> None:
    """Relations between size fields that the config checks or the model assumes and the
    shrunk values broke (sub-configs shrink on their own): each recomputed where it held."""
    w = _width(orig)
    for k, v in orig.items():
        if w and _FOLLOWS_WIDTH.match(k) and v == orig[w] and k != w:
            d[k] = d[w]
        if w and k in ("out_features", "hidden_sizes") and _int_list(v) and v[-1] == orig[w]:
            d[w] = d[k][-1]  # EfficientLoFTR: the width is the last stage's channels
    text, old = (d["text_config"], orig["text_config"]) if isinstance(
        d.get("text_config"), dict) and isinstance(orig.get("text_config"), dict) else (d, orig)
    tw = _width(old)
    for sub, o in [(d[k], orig[k]) for k in d if isinstance(d[k], dict) and d[k] is not text
                   and isinstance(orig.get(k), dict)] + ([(d, orig)] if text is not d else []):
        for k, v in o.items():
            if tw and isinstance(k, str) and _FOLLOWS_TEXT.match(k) and v == old[tw] and k in sub:
                sub[k] = text[tw]
    _follows_backbone(d, orig)
    _head_dim_sum(d, orig)
    heads, inner = d.get("mamba_n_heads"), d.get("mamba_d_ssm") or \
        (d.get("mamba_expand") or 2) * (d.get("hidden_size") or 0)
    if _is_int(d.get("mamba_d_head")) and _is_int(heads) and inner and inner % heads == 0:
        d["mamba_d_head"] = inner // heads  # Mamba-2 heads split the inner width (Bamba)


def _follows_backbone(d: dict, orig: dict) -> None:
    """A detector's input channels: its backbone's stage widths (SAM2's, from the deepest;
    RT-DETR's and D-FINE's, those at out_indices), or its own width (the decoder's)."""
    b, ob = d.get("backbone_config"), orig.get("backbone_config")
    stages = {k: v for k, v in ob.items() if k in b and _int_list(v)} \
        if isinstance(ob, dict) and isinstance(b, dict) else {}
    oi, ni = stages.get("out_indices"), (b or {}).get("out_indices")
    for k, v in orig.items():
        if not (k.endswith(("_in_channels", "_channel_list")) and _int_list(v)):
            continue
        w = next((w for w, x in orig.items() if _WIDTH.match(w) and _is_int(x) and
                  set(v) == {x}), None)
        if w is not None:
            d[k] = [d[w]] * len(v)
            continue
        for wk, ws in sorted(stages.items(), key=lambda kv: "out" not in kv[0]):
            if ws[::-1] == v:
                d[k] = b[wk][::-1]
                break
            if oi and len(ws) >= max(oi) and [ws[i - 1] for i in oi][-len(v):] == v:
                d[k] = [b[wk][i - 1] for i in ni or oi][-len(v):]
                break


def _head_dim_sum(d: dict, orig: dict) -> None:
    """head_dim = qk_nope_head_dim + qk_rope_head_dim where it held, in the config and in
    the per-layer overrides read over it (dots.llm3's sliding layers: 192 + 64 = 256)."""
    keys = ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")

    def holds(m):
        return all(_is_int(m.get(k)) for k in keys) and m[keys[0]] == m[keys[1]] + m[keys[2]]

    if holds(orig):
        d["head_dim"] = d[keys[1]] + d[keys[2]]
    for k, v in d.items():
        olds = orig.get(k) if _index_keyed(v) and isinstance(orig.get(k), dict) else {}
        if olds and all(isinstance(o, dict) and holds({**orig, **o}) for o in olds.values()):
            for o in v.values():
                if not holds(m := {**d, **o}):
                    o["head_dim"] = m[keys[1]] + m[keys[2]]


def _unset(d: dict) -> None:
    """What a default config leaves to the checkpoint and its model cannot do without."""
    depth, types = _old_layers(d), d.get("layer_types")
    if _is_int(depth) and types is None and "layer_types" in d:  # LFM2-MoE
        d["layer_types"] = types = ["full_attention"] * depth
    if _is_int(depth) and d.get("mlp_layer_types", 0) is None:  # DeepSeek-OCR 2: one of each
        d["mlp_layer_types"] = ["dense"] + ["sparse"] * (depth - 1)
    # no attention layer (Bamba, GraniteMoeHybrid): the last one attends, so the hybrid is
    # tested and the cache has a layer that knows its length
    if _is_int(depth) and "attn_layer_indices" in d and d["attn_layer_indices"] is None:
        d["attn_layer_indices"] = [depth - 1]
    if isinstance(types, list) and set(types) == {"linear_attention"}:
        types[-1] = "full_attention"
    if d.get("num_key_value_heads", 0) is None and _is_int(d.get("num_attention_heads")):
        d["num_key_value_heads"] = d["num_attention_heads"]  # Nemotron: as documented
    if d.get("rope_parameters") == {} and isinstance(types, list) and types:
        d["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": 10000.0}
                                for t in dict.fromkeys(types)}  # Cohere Compass: per type
    if d.get("projector_scale_factors") == []:  # LW-DETR: one feature level
        d["projector_scale_factors"] = [1.0]


def _mrope(d: dict, head_dim: int) -> None:
    """Multimodal RoPE splits each head's rotary half into (time, height, width) sections
    that must add up to it: scale them to the new head."""
    ropes = [d.get(key) for key in ("rope_parameters", "rope_scaling")]
    ropes += [v for r in ropes if isinstance(r, dict) for v in r.values()]  # per layer type
    for rope in ropes:
        sec = rope.get("mrope_section") if isinstance(rope, dict) else None
        if _int_list(sec) and sum(sec) > head_dim // 2:
            want = head_dim // 2
            new = [max(1, x * want // sum(sec)) for x in sec]
            new[0] += want - sum(new)
            rope["mrope_section"] = new


def _scale_factor(d: dict) -> int:
    vals = []
    for k, v in d.items():
        if _WIDTH.match(k) or _FFN.search(k) or _HEAD_DIM.match(k) or _LORA.match(k):
            vals += [v] if _is_int(v) else (v if _int_list(v) else [])
    vals = [v for v in vals if v > 0]
    f = 16
    while f > 1 and not all(v % f == 0 and v // f >= 4 for v in vals):
        f //= 2
    return f


def _scaled(d: dict) -> None:
    f = _scale_factor(d)
    for k, v in list(d.items()):
        if _WIDTH.match(k) or _FFN.search(k) or _HEAD_DIM.match(k) or _LORA.match(k):
            if _is_int(v) and v > 0:
                d[k] = v // f
            elif _int_list(v):
                d[k] = [x // f for x in v]


def _walk(d: dict, level: str) -> None:
    orig = copy.deepcopy(d)  # the relations _consistent keeps are read off the original
    for v in d.values():
        if isinstance(v, dict):
            _walk(v, level)
    if not all(isinstance(k, str) for k in d):
        return  # id2label and the like: data, not a config
    _layers(d, TINY["layers"])
    _unset(d)
    _experts(d)
    if _is_int(d.get("image_size")) and d["image_size"] > 224 and level != "layers":
        d["image_size"] = 224  # cost grows with its square; 224 divides by 7, 14, 16 and 32
        if _is_int(d.get("num_windows")):  # LW-DETR: num_windows windows of whole patches
            m = d["num_windows"] * int(d["num_windows"] ** 0.5)
            d["image_size"] = -(-224 // m) * m
    if "prediction_length" in d and d["prediction_length"] is None:
        # a forecaster's horizon is left to the user; the context covers the decoder's
        # label window (Autoformer)
        d["prediction_length"] = 4
        if d.get("context_length") is None:
            d["context_length"] = max(4, d.get("label_length") or 0)
    if "vocab_size" in d and d["vocab_size"] is None and _old_layers(d) is not None:
        d["vocab_size"] = 1000  # left to the tokenizer (ESM): any vocabulary will do
    for k, v in list(d.items()):
        if _SIDE_VOCABS.match(k) and _is_int(v) and v > 1000:
            d[k] = 1000
    if level in _SIZES:
        _tiny(d, _SIZES[level])
        _mrope(d, _SIZES[level]["head_dim"])
    elif level == "scaled":
        _scaled(d)
    _consistent(d, orig)
    if ("head_dim" in d and d["head_dim"] is None and _is_int(d.get("hidden_size")) and
            _is_int(d.get("num_attention_heads"))):
        # derived in __init__ only when absent; from_dict passes the stale None
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]


def shrink_dict(d: dict, level: str) -> dict:
    """A shrunk copy of a config dict."""
    if level not in LEVELS:
        raise ValueError(f"unknown shrink level {level!r}")
    d = copy.deepcopy(d)
    _walk(d, level)
    return d


def shrink(config, level: str):
    """A new config of the same class with every size field shrunk at `level`."""
    return rebuilt(config, shrink_dict(config.to_dict(), level))


def _rederive(config, d: dict) -> None:
    """Attributes __post_init__ derives (Zamba2's mamba_headdim) come back from to_dict, and
    from_dict sets them over the derived ones: where the derivation changes with the
    shrunk fields, they are dropped, to be derived again."""
    from transformers import PreTrainedConfig

    for k, v in vars(config).items():
        if isinstance(v, PreTrainedConfig) and isinstance(d.get(k), dict):
            _rederive(v, d[k])
    try:
        names = {f.name for f in dataclasses.fields(config)} | {"model_type"}
        extra = [k for k, v in d.items() if k not in names and not isinstance(v, dict)]
        fresh = type(config).from_dict({k: v for k, v in d.items() if k not in extra}) \
            if extra else None
    except Exception:  # noqa: BLE001  (not a dataclass, or invalid without them: keep all)
        return
    for k in extra:
        if k in vars(fresh) and getattr(fresh, k) != getattr(config, k, None):
            del d[k]


def rebuilt(config, d: dict):
    """A config of `config`'s class from `d`, an edited copy of its to_dict()."""
    d = {k: v for k, v in d.items()
         if k not in ("transformers_version", "architectures", "_name_or_path")}
    _rederive(config, d)
    return type(config).from_dict(d)
