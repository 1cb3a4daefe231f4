"""HF `generate()` on tpu at bucketed shapes: the programs it compiles grow with the number
of buckets its lengths reach, not with the number of tokens (issue 15, item 3).

Why: transformers' decoding loop (`GenerationMixin._sample`, 5.24) grows four tensors by one
token per step with `torch.cat`: the default DynamicCache's keys and values, `input_ids`, the
2-D attention mask and the position ids. Each new length is a new shape and XLA compiles a
program per shape: Strict compiled about four programs per token and DeferAndFuse the whole
decode step's graph per token (bench shapes: 180 programs for 16 tokens, 468 for 64).

What: on tpu, `_sample` is wrapped. A call it supports runs transformers' own loop with
every growing tensor held at one capacity, the bucket of `max_length` (`_buckets.bucket`):
  - the cache is transformers' StaticCache of that capacity. Its layers write a step's keys
    with `index_copy_` at the cached length (a device tensor, so data), and attention reads
    the whole capacity under the causal mask, which hides the positions not yet written.
    This is transformers' static-cache path, exact;
  - input_ids, the attention mask and the position ids are buffers of that capacity. A step
    writes its column at offset L (an offset is data: docs/DYNAMIC_SHAPES.md). The model is
    given `buf[:, :L]`, of which it reads the slice `[:, -1:]`; the attention mask is given
    whole, zeros past L, which is what transformers pads it to for a static cache.
So every decode step has the same shapes: one program set per capacity. A call takes the
smallest capacity this model has already used that holds it, so after one long call no
shorter one compiles anything. The prefill is keyed by the prompt's length.

The stop flag (`unfinished.max() == 0`) is read after the next step is queued, as
transformers' DeferredStopCheck does on mps, so the device has work while the host waits
for it; the step queued past the stop is dropped, and the cache cropped to the last token.

Each decode step is then captured (torch.tpu.graph, eager/capture.py) and replayed: the
step, from the forward to the token written into the buffers and the stop flag, is one XLA
program, in Strict and DeferAndFuse (not in Debug, whose point is op by op). Its inputs are
device buffers the step updates itself: the last token, its position ids, the column
written (data, so every replay writes the next one), the unfinished rows, the first length
at which every row had finished. So one launch runs STEPS tokens (TPUGraph.replay_steps,
a device loop over the step), and the host reads that length once a launch. The step
stays pooled with the capacity cache, and a later call replays it without recording it
again while a fingerprint of what it was recorded from (the modules, their parameters'
storages, adapters, processors, the cache) is unchanged; anything else records it again
(generation_step.py). The step captured holds only what a replay repeats exactly: the
logits warpers that read the scores alone (`_WARPERS`), the minimum lengths
(`LENGTH_FLOORS`: EOS barred with the length as data), and the EOS stopping criterion (max
length and max time are checked on the host between launches). Other processors or
criteria, scores or logits returned, a streamer, or a region capture refuses
(CaptureError) decode op by op, counted in `generate_uncaptured` with the reason in
`uncaptured_reasons()`;
TORCH_TPU_CAPTURED_GENERATE=0 turns it off. A compiled forward
(cache_implementation="static") is captured too, from its first call: its graph is one node
of the step (compile/program.py records a first call from an abstract trace), so it compiles
once, inside the step's program, and the eager ops around it replay with it (before: 69
programs and 5.7 s for a cold 32-token call of the tiny Llama, 650 tokens/s warm; after:
19 programs, 4.4 s, ~1,180 tokens/s). In Strict, a call whose step is captured runs the
rest (the buffers, the prefill, the first token, the stop flags) as DeferAndFuse does: a
few fused programs per prompt length, not one per op.

The user's choice of cache keeps its meaning: the default dynamic cache runs in the eager
mode (Strict, DeferAndFuse), and `cache_implementation="static"` keeps transformers'
auto-compile of the forward (default backend: tpu). The sequences returned are a view of the
capacity buffer (non-contiguous when the batch is above 1), like a slice on CUDA (of a copy
of it where the buffer is a pooled step's input).

Everything else goes to transformers' loop unchanged, counted in `metrics.counters`
(`generate_unbucketed`) with its reason in `unbucketed_reasons()`: encoder-decoder models, a
cache the user passed, synced_gpus, a prompt given as inputs_embeds, output_attentions or
output_hidden_states, chunked prefill, assisted decoding, model inputs besides the attention
mask and position ids (pixel values, token types), and cache layers other than full attention.
Beam search (`num_beams > 1`) has its own loop, which is not wrapped.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import math
import time

import torch

from .. import _C, _buckets, _config, _on_import, _patches, metrics
from .._patches import Patch
from . import generation_step
from .generation_step import CACHE_POOL, LENGTH_FLOORS, STOP_LAG, first_stop

WRITTEN_AGAINST = "5.24.0"
_MODULE = "transformers.generation.utils"
_GROWN = ("attention_mask", "position_ids")  # the kwargs `_update_model_kwargs_for_generation` grows
_POOL_MAX = 4
_reasons: collections.Counter = collections.Counter()
_uncaptured: collections.Counter = collections.Counter()
# logits warpers that read the scores only (not input_ids, whose buffer holds padding past
# the length): a captured step holds them
_WARPERS = frozenset({"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper",
                      "MinPLogitsWarper", "TypicalLogitsWarper", "EpsilonLogitsWarper",
                      "EtaLogitsWarper", "SuppressTokensLogitsProcessor"})
# max length and time are checked on the host between launches, EOS inside the step
_CRITERIA = frozenset({"MaxLengthCriteria", "MaxTimeCriteria", "EosTokenCriteria"})
_GENERATE_SIGNATURE = (
    "(self: 'GenerativePreTrainedModel', inputs: torch.Tensor | None = None, generation_config: "
    "transformers.generation.configuration_utils.GenerationConfig | None = None, logits_processor: "
    "transformers.generation.logits_process.LogitsProcessorList | None = None, stopping_criteria: "
    "transformers.generation.stopping_criteria.StoppingCriteriaList | None = None, "
    "prefix_allowed_tokens_fn: collections.abc.Callable[[int, torch.Tensor], list[int]] | None = "
    "None, synced_gpus: bool | None = None, assistant_model: Optional[ForwardRef('PreTrainedModel')]"
    " = None, streamer: Optional[ForwardRef('BaseStreamer')] = None, negative_prompt_ids: "
    "torch.Tensor | None = None, negative_prompt_attention_mask: torch.Tensor | None = None, "
    "custom_generate: str | collections.abc.Callable | None = None, **kwargs) -> "
    "transformers.generation.utils.GenerateDecoderOnlyOutput | "
    "transformers.generation.utils.GenerateEncoderDecoderOutput | "
    "transformers.generation.utils.GenerateBeamDecoderOnlyOutput | "
    "transformers.generation.utils.GenerateBeamEncoderDecoderOutput | torch.LongTensor")


def unbucketed_reasons() -> dict:
    """Why tpu `generate()` calls ran transformers' per-token loop: reason -> calls."""
    return dict(_reasons)


def uncaptured_reasons() -> dict:
    """Why bucketed `generate()` calls decoded op by op, not by replays: reason -> calls."""
    return dict(_uncaptured)


def _unsupported(model, input_ids, generation_config, synced_gpus, stopping_criteria, kwargs):
    from transformers.cache_utils import DynamicCache, DynamicLayer, StaticCache, StaticLayer

    cache = kwargs.get("cache")
    checks = (
        (model.config.is_encoder_decoder, "an encoder-decoder model"),
        (synced_gpus, "synced_gpus"),
        (generation_config.is_assistant or kwargs.get("assistant_model") is not None,
         "assisted decoding"),
        (generation_config.prefill_chunk_size is not None, "chunked prefill"),
        (generation_config.output_attentions or generation_config.output_hidden_states,
         "output_attentions or output_hidden_states"),
        (kwargs.get("inputs_embeds") is not None, "a prompt given as inputs_embeds"),
        (stopping_criteria.max_length is None, "no max_length"),
        (cache is None, "no cache (use_cache=False)"),
        (len({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()}) > 1,
         "a model dispatched over several devices (device_map)"),
    )
    for failed, why in checks:
        if failed:
            return why
    if getattr(cache, "_is_user_defined", False):
        return "a cache passed by the user"
    if type(cache) is DynamicCache:
        layer_ok = lambda layer: type(layer) is DynamicLayer  # noqa: E731
    elif type(cache) is StaticCache:
        layer_ok = lambda layer: type(layer) is StaticLayer  # noqa: E731
    else:
        return f"a {type(cache).__name__}"
    if not all(layer_ok(layer) and not layer.is_initialized for layer in cache.layers):
        return "cache layers other than full attention, or a cache holding tokens"
    for key, value in kwargs.items():
        if torch.is_tensor(value) and key not in _GROWN:
            return f"the model input {key!r}"
    return None


def _capacity(model, batch: int, max_length: int) -> int:
    """The smallest capacity this model already holds a cache of that fits, else the bucket."""
    held = [cap for (b, cap, dtype, device) in getattr(model, CACHE_POOL, {})
            if (b, dtype, device) == (batch, model.dtype, model.device) and cap >= max_length]
    return min(held) if held else _buckets.bucket(max_length)


def _static_cache(model, key):
    """The model's pooled StaticCache for (batch, capacity), emptied. Pooled, not rebuilt,
    so its buffers (and a compiled forward's guards on them) stay the same across calls, as
    transformers keeps its own static cache."""
    from transformers.cache_utils import StaticCache

    pool = model.__dict__.setdefault(CACHE_POOL, {})
    batch, capacity = key[:2]
    cache = pool.get(key)
    # DeferAndFuse: the allocation below happens in the first call only. Flushing on both
    # sides of it keeps it out of the graphs every call shares, so the first call's graphs
    # are the later calls' (else the second call compiles its own first graph).
    torch.tpu.synchronize()
    if cache is None:
        while len(pool) >= _POOL_MAX:  # the oldest goes: each holds keys at full capacity
            generation_step.forget(model, next(iter(pool)))
            pool.pop(next(iter(pool)))
        config = model.config.get_text_config(decoder=True)
        cache = pool[key] = StaticCache(config=config, max_cache_len=capacity)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Allocated now, not inside the first forward, for the same reason.
        cache.early_initialization(batch, heads, head_dim, model.dtype, model.device)
        torch.tpu.synchronize()
    cache.reset()
    return cache


def _capacity_buffer(t: torch.Tensor, capacity: int, fill, into=None) -> torch.Tensor:
    """`t` written at the start of a capacity buffer of `fill`: `into` (the decode step's
    own buffer, of the same layout) or a new one."""
    buf = t.new_full((*t.shape[:-1], capacity), fill) if into is None else into.fill_(fill)
    buf[..., :t.shape[-1]] = t
    return buf


def _grow(key: str, buf: torch.Tensor, at: int) -> None:
    """Write column `at` of a grown kwarg as `_update_model_kwargs_for_generation` would."""
    if key == "attention_mask":
        buf[..., at].fill_(1)
    else:  # position ids: one past the last
        buf[..., at:at + 1].copy_(buf[..., at - 1:at] + 1)


def _model_kwargs(kwargs: dict, grown: dict, length: int) -> dict:
    out = dict(kwargs)
    for key, buf in grown.items():
        out[key] = buf if key == "attention_mask" else buf[..., :length]
    return out


def _bucketed_sample(model, input_ids, logits_processor, stopping_criteria, generation_config,
                     streamer, model_kwargs, why):
    """transformers' `_sample` at a capacity; `why`: why the decode step is not captured,
    or None."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    batch, length = input_ids.shape
    max_length = stopping_criteria.max_length
    capacity = _capacity(model, batch, max_length)
    # Compile as transformers would for the cache the user chose (the default dynamic cache
    # never auto-compiles), then swap in the capacity cache.
    compiled = model._valid_auto_compile_criteria(model_kwargs, generation_config)
    forward = model.get_compiled_call(generation_config.compile_config) if compiled else model.__call__
    pooled = (batch, capacity, model.dtype, model.device)  # the cache's key, and its step's
    cache = _static_cache(model, pooled)
    kwargs = dict(model_kwargs, cache=cache)

    pad = generation_config._pad_token_tensor
    pad = pad.to(input_ids.device) if pad is not None else None
    # (the tensor is made from the config's int; read only where it came from elsewhere:
    # transformers pads with the first EOS token when no pad token is set)
    given_pad = generation_config.pad_token_id
    pad_value = (None if pad is None else given_pad if type(given_pad) is int else pad.item())
    given = {k: kwargs.pop(k) for k in _GROWN if kwargs.get(k) is not None}
    step = None
    if why is None:  # the step a call of the same bucket captured, if it would be this one's
        layout = (input_ids.dtype, tuple((k, t.dtype, t.shape[:-1]) for k, t in given.items()))
        fingerprint = generation_step.fingerprint(
            model, forward, kwargs, logits_processor, stopping_criteria, pad_value,
            generation_config.do_sample, layout)
        step = generation_step.for_call(model, pooled, fingerprint, input_ids, given, capacity,
                                        stopping_criteria)
    # (the step's buffers are its inputs: the prefill writes into them)
    into = {} if step is None else {"ids": step.ids, "attention_mask": step.mask}
    ids = _capacity_buffer(input_ids, capacity, pad_value or 0, into.get("ids"))
    grown = {k: _capacity_buffer(t, capacity, 0, into.get(k)) for k, t in given.items()}
    want = generation_config.return_dict_in_generate
    scores = () if want and generation_config.output_scores else None
    raw_logits = () if want and generation_config.output_logits else None
    has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    unfinished = torch.ones(batch, dtype=torch.long, device=input_ids.device)
    unread = collections.deque()  # (all rows finished, length then) of steps not read yet
    prompt = cached = length  # cached: positions the cache holds once queued work has run
    stop = None               # the length at which every row had finished

    inputs = model.prepare_inputs_for_generation(
        ids[:, :length], is_first_iteration=True, **_model_kwargs(kwargs, grown, length))
    outputs = model(**inputs, return_dict=True)
    with model._optimize_model_for_decode():
        while True:
            logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
            del outputs
            step_scores = logits_processor(ids[:, :length], logits)
            if scores is not None:
                scores += (step_scores,)
            if raw_logits is not None:
                raw_logits += (logits,)
            if generation_config.do_sample:
                probs = torch.nn.functional.softmax(step_scores, dim=-1)
                tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                tokens = torch.argmax(step_scores, dim=-1)
            if has_eos:
                tokens = tokens * unfinished + pad * (1 - unfinished)
            ids[:, length] = tokens
            for key, buf in grown.items():
                _grow(key, buf, length)
            length += 1
            unfinished = unfinished & ~stopping_criteria(ids[:, :length], scores)
            if streamer is not None:
                streamer.put(tokens.cpu())
            unread.append((unfinished.max() == 0, length))
            if length >= max_length:
                break
            if why is None:
                why = step.start(pooled, model, forward, kwargs, length, grown.get("position_ids"),
                                 unfinished, generation_config.do_sample, logits_processor,
                                 stopping_criteria, pad)
                if why is None:
                    length, cached, stop = step.run(length, max_length, unread)
                    break
            inputs = model.prepare_inputs_for_generation(
                ids[:, :length], next_sequence_length=1, **_model_kwargs(kwargs, grown, length))
            outputs = forward(**inputs, return_dict=True)
            cached = length
            if len(unread) == STOP_LAG and (stop := first_stop(unread, 1)) is not None:
                break
    if why is not None:
        metrics.count("generate_uncaptured")
        _uncaptured[why] += 1
    if stop is None:  # the loop reached max_length: the flags not read yet
        stop = first_stop(unread, len(unread))
    final = length if stop is None else stop
    if cached > final - 1:  # keys of the steps past the stop: the cache ends at the last token
        cache.crop(-(cached - (final - 1)))
    if scores is not None:
        scores = scores[:final - prompt]
    if raw_logits is not None:
        raw_logits = raw_logits[:final - prompt]
    if streamer is not None:
        streamer.end()
    # a pooled step's buffer is the next call's input: the sequences are a view of a copy
    # (of the whole buffer: one program per capacity, not one per length)
    sequences = (ids if step is None or why is not None else ids.clone())[:, :final]
    if not want:
        return sequences
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=raw_logits,
                                     cache=cache)


def _fused_strict(captured: bool):
    """Strict, where the decode step is captured: what is not replayed (the buffers, the
    prefill, the first token, the stop flags) runs as DeferAndFuse runs it, a few fused
    programs for a new prompt length rather than one per op."""
    from ..eager.modes import EagerMode, eager_mode, get_eager_mode

    if captured and get_eager_mode() is EagerMode.STRICT:
        return eager_mode(EagerMode.DEFER_AND_FUSE)
    return contextlib.nullcontext()


def _uncapturable(model, generation_config, model_kwargs, processors, criteria, streamer):
    """Why the decode step is not captured, or None (see the module doc)."""
    from transformers.generation.utils import GenerationMixin

    from ..eager.modes import EagerMode, get_eager_mode

    per_step = generation_config.return_dict_in_generate and (
        generation_config.output_scores or generation_config.output_logits)
    checks = (
        (not _config.get("TORCH_TPU_CAPTURED_GENERATE"), "TORCH_TPU_CAPTURED_GENERATE=0"),
        (get_eager_mode() is EagerMode.DEBUG, "Debug mode runs op by op"),
        (per_step, "scores or logits returned per step"),
        (streamer is not None, "a streamer"),
        (model.device.index not in (None, 0) and _C.multi(),
         "a model on another device than tpu:0 (capture is tpu:0's)"),
        (type(model).prepare_inputs_for_generation is not GenerationMixin.prepare_inputs_for_generation,
         "the model's own prepare_inputs_for_generation"),
    )
    for failed, why in checks:
        if failed:
            return why
    processor_ok = _WARPERS | LENGTH_FLOORS.keys()
    for kind, objs, allowed, module in (("logits processor", processors, processor_ok, "logits_process"),
                                        ("stopping criterion", criteria, _CRITERIA, "stopping_criteria")):
        for obj in objs:  # transformers' own classes, not subclasses or look-alikes
            if type(obj).__name__ not in allowed or not type(obj).__module__.endswith(module):
                return f"the {kind} {type(obj).__name__}"
    return None


def _sample(original):
    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config,
                synced_gpus=False, streamer=None, **model_kwargs):
        if input_ids.device.type == "tpu" and _config.get("TORCH_TPU_BUCKETED_GENERATE"):
            why = _unsupported(self, input_ids, generation_config, synced_gpus,
                               stopping_criteria, model_kwargs)
            if why is None:
                metrics.count("generate_bucketed")
                why = _uncapturable(self, generation_config, model_kwargs, logits_processor,
                                    stopping_criteria, streamer)
                with _fused_strict(why is None):
                    return _bucketed_sample(self, input_ids, logits_processor, stopping_criteria,
                                            generation_config, streamer, model_kwargs, why)
            metrics.count("generate_unbucketed")
            _reasons[why] += 1
        return original(self, input_ids, logits_processor, stopping_criteria, generation_config,
                        synced_gpus, streamer, **model_kwargs)
    return _sample


def _generate(original):
    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        # DeferAndFuse: what the user recorded before the call is flushed on its own, not
        # into generate's first graph, which would then differ from call to call.
        if self.device.type == "tpu" and _config.get("TORCH_TPU_BUCKETED_GENERATE"):
            torch.tpu.synchronize()
        return original(self, *args, **kwargs)
    return generate


def _capturing(original):
    @functools.wraps(original)
    def is_cuda_stream_capturing():
        return original() or torch.tpu.is_current_stream_capturing()
    return is_cuda_stream_capturing


PATCHES = [
    Patch("transformers.utils.import_utils:is_cuda_stream_capturing", "() -> bool", _capturing,
          "HF skips its host-side checks (is_tracing) while CUDA or XPU captures a graph, "
          "not while tpu does (torch.tpu.graph): they would sync inside the region"),
    Patch(f"{_MODULE}:GenerationMixin._sample",
          "(self: 'GenerativePreTrainedModel', input_ids: torch.LongTensor, "
          "logits_processor: transformers.generation.logits_process.LogitsProcessorList, "
          "stopping_criteria: transformers.generation.stopping_criteria.StoppingCriteriaList, "
          "generation_config: transformers.generation.configuration_utils.GenerationConfig, "
          "synced_gpus: bool = False, streamer: Optional[ForwardRef('BaseStreamer')] = None, "
          "**model_kwargs) -> transformers.generation.utils.GenerateDecoderOnlyOutput | "
          "transformers.generation.utils.GenerateEncoderDecoderOutput | torch.LongTensor",
          _sample, "each token is a new shape: a program set per token on tpu"),
    Patch(f"{_MODULE}:GenerationMixin.generate", _GENERATE_SIGNATURE, _generate,
          "DeferAndFuse: the user's pending ops would join generate's first graph"),
]


def _patch() -> None:
    _patches.apply_all(PATCHES, f"transformers' generation (written against {WRITTEN_AGAINST}) "
                       "is left unpatched: generate() on tpu compiles programs per token")


def install() -> None:
    """Patch transformers' generation now if it is loaded, else as soon as it is."""
    _on_import.when_imported(_MODULE, _patch, lambda m: hasattr(m, "GenerationMixin"))


__all__ = ["install", "unbucketed_reasons", "uncaptured_reasons"]
