"""Inputs for any transformers model, from its config and forward signature: token ids,
images, raw audio or audio features. `candidates` lists the plausible input sets, most
likely first; the model sweep uses the first that runs on CPU."""
from __future__ import annotations

import inspect

import torch

BATCH, SEQ = 2, 8


def _sub(config, *names):
    for n in names:
        sub = getattr(config, n, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool, list)):
            return sub
    return config


def _get(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def _text_config(config):
    try:
        return config.get_text_config(decoder=True)
    except Exception:
        return _sub(config, "text_config", "decoder")


def _vocab(config) -> int:
    v = _get(_text_config(config), "vocab_size") or _get(config, "vocab_size") or 100
    return int(v)


def _image_hw(vc) -> tuple[int, int]:
    size = _get(vc, "image_size", "input_size", "img_size", default=224)
    if isinstance(size, dict):
        size = [size.get("height", 224), size.get("width", 224)]
    if isinstance(size, (list, tuple)):
        size = [s for s in size if isinstance(s, int)][-2:] or [224]
        return (size[0], size[-1])
    return (int(size), int(size))


def ids(config, g, batch=BATCH, seq=SEQ) -> torch.Tensor:
    # above the usual special tokens (0-2), below the tokens multimodal models reserve at
    # the top of the vocabulary
    hi = max(min(_vocab(config), 1000), 4)
    return torch.randint(3 if hi > 8 else 0, hi, (batch, seq), generator=g)


def _pixels(config, g, batch=BATCH):
    vc = _sub(config, "vision_config", "backbone_config", "encoder")
    c = int(_get(vc, "num_channels", "in_channels", "in_chans", default=3))
    h, w = _image_hw(vc)
    return torch.randn(batch, c, h, w, generator=g)


def _audio(config, g) -> list[tuple[str, dict]]:
    out = [("audio", {"input_values": torch.randn(BATCH, 4000, generator=g)})]
    mel = _get(config, "num_mel_bins", default=None)
    if isinstance(mel, int):  # a spectrogram: (batch, frames, mel bins)
        t = int(_get(config, "max_length", default=128))
        out.insert(0, ("spectrogram", {"input_values": torch.randn(BATCH, t, mel, generator=g)}))
    out.append(("audio-1ch", {"input_values": torch.randn(BATCH, 1, 4000, generator=g)}))
    # a whole number of 1920-sample frames (and of 80, 128, 240, 320, 384, 640 samples)
    out.append(("audio-3840", {"input_values": torch.randn(BATCH, 3840, generator=g)}))
    return out


def _features(config, g, params) -> list[tuple[str, dict]]:
    """Audio features as (batch, features, frames) and (batch, frames, features) with the
    config's feature size, as a 1-channel image (CLAP), then in the first two layouts
    with 128 mel bins and with stacked frames (encoders whose config does not name the
    size they read)."""
    ac = _sub(config, "audio_config", "encoder_config", "asr_config", "encoder")
    f = int(_get(ac, "num_mel_bins", "feature_size", "input_feat_per_channel", "input_dim",
                 default=80))
    src = _get(ac, "max_source_positions", default=None)
    t = 2 * int(src) if isinstance(src, int) and src <= 4096 else 64
    window = _get(ac, "n_window", default=None)  # chunked encoders read whole windows
    t, t2 = (2 * window, 2 * window) if isinstance(window, int) and window <= 512 else (t, 64)
    stack = int(_get(ac, "num_stacked_frames", default=4))
    out = []
    for i, size in enumerate(dict.fromkeys((f, 128, 2 * f, stack * f))):
        tag = "" if i == 0 else f"-{size}"
        for label, shape, frames in (("features", (BATCH, size, t), t),
                                     ("features-T", (BATCH, t2, size), t2)):
            kw = {"input_features": torch.randn(*shape, generator=g)}
            if "input_features_mask" in params:  # one flag a frame
                kw["input_features_mask"] = torch.ones(BATCH, frames, dtype=torch.long)
            out.append((label + tag, kw))
        if i == 0:
            out.append(("features-4d",
                        {"input_features": torch.randn(BATCH, 1, 64, f, generator=g)}))
    return out


def _text(config, g, params) -> list[tuple[str, dict]]:
    text = {"input_ids": ids(config, g)}
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        text["decoder_input_ids"] = ids(config, g)
    if "bbox" in params:  # layout models: one box per token
        text["bbox"] = torch.tensor([0, 0, 10, 10]).expand(BATCH, SEQ, 4).contiguous()
    out = [("ids", text)]
    if "attention_mask" in params:
        out.append(("ids+mask", {**text, "attention_mask": torch.ones_like(text["input_ids"])}))
    eos = _get(_text_config(config), "eos_token_id") or _get(config, "eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if isinstance(eos, int) and 0 <= eos < _vocab(config):
        # sequence classifiers of the BART family read the state at each row's <eos>
        with_eos = dict(text, input_ids=text["input_ids"].clone())
        with_eos["input_ids"][:, -1] = eos
        out.append(("ids+eos", with_eos))
    return out


def _video(config, g, name) -> list[tuple[str, dict]]:
    """(batch, frames, channels, height, width), the layout of video transformers."""
    vc = _sub(config, "vision_config")
    frames = int(_get(vc, "num_frames", "frames_per_clip", default=8))
    tubelet = _get(vc, "tubelet_size", default=None)
    tubelet = tubelet[0] if isinstance(tubelet, (list, tuple)) else tubelet
    if isinstance(tubelet, int):
        frames = max(frames, tubelet)
    px = _pixels(config, g)
    return [("video", {name: px.unsqueeze(1).expand(-1, frames, -1, -1, -1).contiguous()})]


def _series(config, g, params) -> list[tuple[str, dict]]:
    n = int(_get(config, "context_length", default=32))
    c = int(_get(config, "num_input_channels", default=1))
    if "past_time_features" in params:  # forecasting transformers: lagged history, dates
        return _forecast(config, g, n)
    return [("series", {"past_values": torch.randn(BATCH, n, c, generator=g)}),
            ("series-2d", {"past_values": torch.randn(BATCH, n, generator=g)})]


def _forecast(config, g, n) -> list[tuple[str, dict]]:
    """A forecaster's inputs: the context plus its largest lag of history, time
    features for it and for the horizon, which steps were observed, and the horizon's
    values (teacher forcing)."""
    past = n + max(getattr(config, "lags_sequence", None) or [0])
    horizon = int(_get(config, "prediction_length", default=4))
    f = int(_get(config, "num_time_features", default=1))
    return [("forecast", {
        "past_values": torch.randn(BATCH, past, generator=g),
        "past_time_features": torch.randn(BATCH, past, f, generator=g),
        "past_observed_mask": torch.ones(BATCH, past),
        "future_values": torch.randn(BATCH, horizon, generator=g),
        "future_time_features": torch.randn(BATCH, horizon, f, generator=g)})]


def _merge(config) -> int:
    m = _get(config, "spatial_merge_size", "merge_size", "merge_kernel_size", default=2)
    return int(m[0] if isinstance(m, (list, tuple)) else m)


def _patch_grid(config, g, name, grid_name) -> list[tuple[str, dict]]:
    """Images as a vision tower of the Qwen-VL family takes them: the patches of all images
    flattened into one sequence, with a (frames, rows, columns) grid per image. Two images
    of 4x4 patches (twice the spatial merge), in the layouts such towers read: one row a
    patch (channels x frames x patch x patch), each patch as a small image, or each merged
    group of patches as a channels-last image."""
    c = int(_get(config, "in_channels", "num_channels", default=3))
    p = int(_get(config, "patch_size", default=14))
    t = int(_get(config, "temporal_patch_size", "patch_temporal", default=1))
    m = _merge(config)
    side = 2 * m
    n = side * side
    grid = torch.tensor([[1, side, side]] * BATCH)
    layouts = [("rows", (BATCH * n, c * t * p * p), grid),
               ("rows-t1", (BATCH * n, c * p * p), grid),
               ("patches", (BATCH * n, c, p, p), grid),
               ("patches-t", (BATCH * n, c, t, p, p), grid),
               # the grid counted in merged tokens (Inkling2)
               ("merged", (BATCH * n // (m * m), p * m, p * m, c), grid // torch.tensor([1, m, m]))]
    return [(f"grid-{label}", {name: torch.randn(*shape, generator=g), grid_name: thw})
            for label, shape, thw in layouts]


def _patch_sequence(config, g, params) -> list[tuple[str, dict]]:
    """Images as patch sequences with explicit positions (SigLIP2's NaFlex, Gemma 4's
    tower): (batch, patches, channels x patch x patch), with the patch grid's shape or
    each patch's (x, y), and a mask of the real patches. The side is a multiple of the
    tower's pooling kernel."""
    c = int(_get(config, "num_channels", "in_channels", default=3))
    p = int(_get(config, "patch_size", default=16))
    k = int(_get(config, "pooling_kernel_size", default=1))
    side = 4 if k == 1 else 2 * k
    n = side * side
    kw = {"pixel_values": torch.randn(BATCH, n, c * p * p, generator=g)}
    if "pixel_position_ids" in params:
        rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        xy = torch.stack([cols, rows], -1).reshape(1, n, 2)
        kw["pixel_position_ids"] = xy.expand(BATCH, -1, -1).contiguous()
    if "spatial_shapes" in params:
        kw["spatial_shapes"] = torch.tensor([[side, side]] * BATCH)
    if "pixel_attention_mask" in params:
        kw["pixel_attention_mask"] = torch.ones(BATCH, n, dtype=torch.long)
    return [("patch-sequence", kw)]


_EMBEDS = ("inputs_embeds", "hidden_states", "query_embeds", "noise_embeds")


def _embeds(config, g, params) -> list[tuple[str, dict]]:
    """Hidden states for a module whose forward takes only embeddings (a Q-Former's
    queries, an audio tokenizer's latents): (batch, sequence, width) or channels first."""
    names = [n for n in _EMBEDS if n in params and params[n].default is inspect.Parameter.empty]
    if not names:
        return []
    width = int(_get(_text_config(config), "hidden_size", "d_model", "dim", "embed_dim",
                     default=None) or _get(config, "hidden_size", "d_model", "hidden_dim",
                                           "embed_dim", "vae_dim", default=64))
    out = [(label, {n: torch.randn(*shape, generator=g) for n in names})
           for label, shape in (("embeds", (BATCH, SEQ, width)),
                                ("embeds-T", (BATCH, width, SEQ)),
                                ("embeds-audio", (BATCH, 1, 4000)))]
    cross = _get(config, "encoder_hidden_size", default=None)
    if "encoder_hidden_states" in params and isinstance(cross, int):  # what it attends to
        for _, kw in out:
            kw["encoder_hidden_states"] = torch.randn(BATCH, SEQ, cross, generator=g)
    return out


# required arguments that go with another input, by name: made like that input
_LIKE = {"prompt_pixel_values": "pixel_values", "prompt_masks": "pixel_values",
         "past_values_padding": "past_values"}


_VISUAL = {"visual_feats": "visual_feat_dim", "visual_pos": "visual_pos_dim"}


def _companions(config, g, params, kw: dict) -> dict:
    """`kw` with the arguments a forward requires beside its main input: a second
    prompt's token ids (InstructBLIP's Q-Former, OneFormer's task), a prompt image and mask like the image
    (SegGPT), a padding flag a step and a frequency (TimesFM), a language id (X-MOD), a
    padding flag a frame (Gemma 3n's audio)."""
    out = dict(kw)
    for name, p in params.items():
        if name in out or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        required = p.default is inspect.Parameter.empty
        if required and name.endswith(("input_ids", "task_inputs")):  # token ids
            out[name] = ids(config, g, seq=int(getattr(config, "task_seq_len", SEQ)))
        elif required and _LIKE.get(name) in out:
            like = out[_LIKE[name]]
            out[name] = torch.zeros_like(like) if "padding" in name else \
                torch.randn(like.shape, generator=g)
        elif required and name == "freq":
            out[name] = torch.zeros(BATCH, 1, dtype=torch.long)
        elif name == "lang_ids" and getattr(config, "default_language", "") is None:
            out[name] = torch.zeros(BATCH, dtype=torch.long)  # no language set (X-MOD)
        elif isinstance(getattr(config, _VISUAL.get(name, ""), None), int):
            # a detector's region features and boxes (LXMERT)
            out[name] = torch.rand(BATCH, SEQ, getattr(config, _VISUAL[name]), generator=g)
        elif name == "audio_mel_mask" and "audio_mel" in out:  # True where padded
            out[name] = torch.zeros(out["audio_mel"].shape[:2], dtype=torch.bool)
    return out


_MODALITIES = {"input_ids": ("ids", _text), "pixel_values": ("pixels", None),
               "pixel_values_videos": ("video", None),
               "input_features": ("features", _features), "input_values": ("audio", _audio),
               "past_values": ("series", _series), "audio_mel": ("mel", None)}


def candidates(model, config, seed: int = 0) -> list[tuple[str, dict]]:
    """(label, kwargs) input sets for `model.forward`, the most likely first: the main
    input alone, then with each other modality the forward takes (a CLIP-like model needs
    ids and pixels), then each other modality alone."""
    g = torch.Generator().manual_seed(seed)
    params = inspect.signature(model.forward).parameters
    grid = next((n for n in ("grid_thw", "image_grid_thw") if n in params), None)
    if grid is not None and "input_ids" not in params and (
            "hidden_states" in params or "pixel_values" in params):  # a vision tower
        name = "pixel_values" if "pixel_values" in params else "hidden_states"
        sets = _patch_grid(config, g, name, grid)
        if "merge_sizes" in params:  # one merge size per image (VideoLLaMA3)
            for _, kw in sets:
                kw["merge_sizes"] = torch.full((BATCH,), _merge(config))
        return sets
    if "input_ids" not in params and (
            "pixel_position_ids" in params or "spatial_shapes" in params):  # a vision tower
        return _patch_sequence(config, g, params)
    main = getattr(model, "main_input_name", "input_ids")
    main = main[0] if isinstance(main, (list, tuple)) else main  # OneFormer names two
    variants = {}
    for arg, (_, make) in _MODALITIES.items():
        if arg in params:
            if arg == "pixel_values":
                px = _pixels(config, g)
                variants[arg] = [("pixels", {"pixel_values": px})]
                if _get(_sub(config, "vision_config"), "num_frames", default=None):
                    variants[arg] += _video(config, g, arg)
                # image pairs, for keypoint matchers (LightGlue)
                variants[arg].append(("pixel-pairs",
                                      {"pixel_values": torch.stack([px, px.flip(0)], 1)}))
            elif arg == "pixel_values_videos":
                variants[arg] = _video(config, g, arg)
            elif arg in ("input_ids", "input_features", "past_values"):
                variants[arg] = make(config, g, params)
            elif arg == "audio_mel":  # frames by mel bins (Gemma 3n)
                variants[arg] = [(f"mel{label[len('features-T'):]}",
                                  {"audio_mel": kw["input_features"]})
                                 for label, kw in _features(config, g, params)
                                 if label.startswith("features-T")]
            else:
                variants[arg] = make(config, g)
    if not variants:
        return [(label, _companions(config, g, params, kw))
                for label, kw in _embeds(config, g, params)]
    if "decoder_input_ids" in params and "input_ids" not in params:
        # speech-to-text: the decoder's prompt goes with every input set
        prompt = ids(config, g)
        for sets in variants.values():
            for _, kw in sets:
                kw["decoder_input_ids"] = prompt
    order = ([main] if main in variants else []) + [a for a in variants if a != main]
    out: list[tuple[str, dict]] = []
    for i, arg in enumerate(order):
        for j, (label, kw) in enumerate(variants[arg]):
            out.append((label, kw))
            if i == 0:  # the main input's first form with every form of the others
                for other in order[1:]:
                    for olabel, okw in variants[other][:None if j == 0 else 1]:
                        out.append((f"{label}+{olabel}", {**kw, **okw}))
    return [(label, _companions(config, g, params, kw)) for label, kw in out]
