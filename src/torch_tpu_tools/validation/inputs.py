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
    return out


def _features(config, g) -> list[tuple[str, dict]]:
    ac = _sub(config, "audio_config", "encoder_config", "encoder")
    f = int(_get(ac, "num_mel_bins", "feature_size", "input_feat_per_channel", "input_dim",
                 default=80))
    src = _get(ac, "max_source_positions", default=None)
    t = 2 * int(src) if isinstance(src, int) and src <= 4096 else 64
    return [("features", {"input_features": torch.randn(BATCH, f, t, generator=g)}),
            ("features-T", {"input_features": torch.randn(BATCH, 64, f, generator=g)}),
            # a spectrogram as a 1-channel image (CLAP)
            ("features-4d", {"input_features": torch.randn(BATCH, 1, 64, f, generator=g)})]


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


def _series(config, g) -> list[tuple[str, dict]]:
    n = int(_get(config, "context_length", default=32))
    c = int(_get(config, "num_input_channels", default=1))
    return [("series", {"past_values": torch.randn(BATCH, n, c, generator=g)}),
            ("series-2d", {"past_values": torch.randn(BATCH, n, generator=g)})]


_MODALITIES = {"input_ids": ("ids", _text), "pixel_values": ("pixels", None),
               "pixel_values_videos": ("video", None),
               "input_features": ("features", _features), "input_values": ("audio", _audio),
               "past_values": ("series", _series)}


def candidates(model, config, seed: int = 0) -> list[tuple[str, dict]]:
    """(label, kwargs) input sets for `model.forward`, the most likely first: the main
    input alone, then with each other modality the forward takes (a CLIP-like model needs
    ids and pixels), then each other modality alone."""
    g = torch.Generator().manual_seed(seed)
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    variants = {}
    for arg, (_, make) in _MODALITIES.items():
        if arg in params:
            if arg == "pixel_values":
                variants[arg] = [("pixels", {"pixel_values": _pixels(config, g)})]
                if _get(_sub(config, "vision_config"), "num_frames", default=None):
                    variants[arg] += _video(config, g, arg)
            elif arg == "pixel_values_videos":
                variants[arg] = _video(config, g, arg)
            elif arg == "input_ids":
                variants[arg] = make(config, g, params)
            else:
                variants[arg] = make(config, g)
    order = ([main] if main in variants else []) + [a for a in variants if a != main]
    out: list[tuple[str, dict]] = []
    for i, arg in enumerate(order):
        for j, (label, kw) in enumerate(variants[arg]):
            out.append((label, kw))
            if i == 0:  # the main input's first form with every form of the others
                for other in order[1:]:
                    for olabel, okw in variants[other][:None if j == 0 else 1]:
                        out.append((f"{label}+{olabel}", {**kw, **okw}))
    return out
