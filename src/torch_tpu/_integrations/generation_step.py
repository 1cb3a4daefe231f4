"""generate()'s decode step captured as one program (eager/capture.py), and reused by later
calls while what it was captured from is unchanged (issue 52, item 2).

The step is the forward of one token, the warpers, the token chosen and written into the
capacity buffers, and the stop flag (generation.py's module doc says which calls capture
it). Its inputs are device buffers it updates itself: the last token, the next column, the
position ids, the unfinished rows, the first length at which every row had finished, and
the capacity buffers of input_ids and the attention mask. Recording it again at every call
cost ~2.8 ms on the tiny Llama of `bench generate` (about a third of a 32-token call), so a
step stays pooled on the model beside the capacity cache it writes, and a later call of
the same bucket prefills into the step's own buffers and replays it without recording.

Reuse is safe while the recording would be the same program over the same storages. The
fingerprint, taken at the start of each call (before the prefill), holds:
  - every module of the model: its type, training flag and attributes, its parameters and
    buffers by storage (an in-place update, such as an optimizer step, is read by the
    replay; a replaced tensor is a new storage), its hooks; so a swapped layer, a PEFT
    adapter switched, merged or disabled, or a changed attention setting records again;
  - the model's configs and the cache's layers by value, their tensors by storage;
  - the logits processors and the EOS criterion by value (new objects each call, whose
    numbers and small tensors the step holds as constants), the pad token, sampling, and
    the buffers' layout (batch, dtypes, which of the mask and position ids are grown);
  - the eager mode, grad mode, autocast, and the torch function and dispatch modes.
Anything else an object holds is compared by identity (held, so an id is never reused).
A mismatch records the step again and replaces the pooled one. Max length and max time are
checked on the host between launches, so they are not part of it.
"""
from __future__ import annotations

import collections
import math
import time
import types

import torch

from .. import metrics
from ..eager import capture
from ..op import current

CACHE_POOL = "_tpu_generate_caches"  # model attribute: {(batch, capacity, dtype, device): StaticCache}
_STEP_POOL = "_tpu_generate_steps"   # model attribute: {cache pool key: _CapturedStep}
NEVER = 2 ** 62
# processors that bar EOS below a length they read from input_ids' shape -> that length; in
# the step the length is data (its next column), so the step bars EOS with it
LENGTH_FLOORS = {
    "MinLengthLogitsProcessor": lambda p: p.min_length,
    "MinNewTokensLengthLogitsProcessor": lambda p: p.prompt_length_to_skip + p.min_new_tokens}
# The stop flag of step t is read after step t + STOP_LAG - 1 is queued. 1, as
# transformers' DeferredStopCheck: the host reads a flag that the step it has just queued
# follows. 2 would let the host record a step while the device runs the one before, but on
# XLA:CPU host and device share two cores, and DeferAndFuse decoded 184-194 tokens/s with
# 2 against 261-271 with 1. The flag is read even when only max_length can stop (it is then
# always false): it bounds how far the host runs ahead.
STOP_LAG = 1
# Decode tokens a replay launches (TPUGraph.replay_steps: a device loop over the captured
# step). One launch a token cost ~0.2 ms of host work and XLA:CPU launch on the tiny Llama,
# several times the step's own compute. With EOS, up to 2 x STEPS - 1 steps may run past
# the stop (their tokens are padding, dropped, and the cache is cropped), as one step did.
STEPS = 8
# model attributes that change from call to call and that no forward reads: the pools, and
# transformers' memo of the last call's cache length (read when it prepares a cache)
_HOST_MEMOS = frozenset({CACHE_POOL, _STEP_POOL, "_previous_max_cache_length"})
_SMALL = 16  # a processor's tensors up to this many elements are compared by value


def for_call(model, key, fingerprint, input_ids, given, capacity, criteria):
    """This call's decode step: the one pooled for the cache `key` (generation.py's pool) if
    it was captured from what `fingerprint` describes, else a new one, captured at the
    call's first token (the pooled one is dropped). Its `ids` and `mask` are the call's
    capacity buffers, which the prefill writes into."""
    # DeferAndFuse: the call's setup so far runs as a graph of its own, and a new step's
    # buffers are made apart from the call's graphs too, so that the first call's graphs
    # are the ones later calls make (each a cache hit)
    current.flush_pending("generate")
    pool = model.__dict__.setdefault(_STEP_POOL, {})
    step = pool.get(key)
    if step is not None and step.fingerprint == fingerprint:
        return step
    pool.pop(key, None)
    step = _CapturedStep(input_ids, given, capacity, criteria, fingerprint)
    current.flush_pending("generate")
    return step


def forget(model, key) -> None:
    """The cache `key` left the pool: its step goes with it."""
    model.__dict__.get(_STEP_POOL, {}).pop(key, None)


class _CapturedStep:
    """One decode step as a captured program over device buffers it updates itself."""

    def __init__(self, input_ids, given, capacity, criteria, fingerprint):
        dev, batch = input_ids.device, input_ids.shape[0]
        mask, pos = given.get("attention_mask"), given.get("position_ids")
        self.fingerprint = fingerprint
        self.captured = False
        self.ids = input_ids.new_zeros((batch, capacity))                     # capacity buffers
        self.mask = None if mask is None else mask.new_zeros((*mask.shape[:-1], capacity))
        self.cur = input_ids.new_zeros((batch, 1))                            # the last token
        self.col = torch.zeros((1,), dtype=torch.long, device=dev)            # the next column
        self.pos = None if pos is None else pos.new_zeros((*pos.shape[:-1], 1))
        self.unfinished = torch.ones(batch, dtype=torch.long, device=dev)
        # the first length after which every row had finished (NEVER: none yet)
        self.stop_at = (torch.full((1,), NEVER, dtype=torch.long, device=dev)
                        if any(type(c).__name__ == "EosTokenCriteria" for c in criteria) else None)
        self.timers = []
        # keep_graph: the one-step program is never compiled, replay_steps' loop is
        self.graph = capture.TPUGraph(keep_graph=True)

    def start(self, key, model, forward, kwargs, length, pos, unfinished, sample, processors,
              criteria, pad):
        """This call's decode from its first token: the step captured now (and pooled for
        the next calls), or, pooled already, as it was captured -> None, or why capture
        refused it."""
        self.cur.copy_(self.ids[:, length - 1:length])
        self.col.fill_(length)
        if self.pos is not None:
            self.pos.copy_(pos[..., length - 1:length])
        self.unfinished.copy_(unfinished)
        if self.stop_at is not None:
            self.stop_at.fill_(NEVER)
        self.timers = [c for c in criteria if type(c).__name__ == "MaxTimeCriteria"]
        if self.captured:
            metrics.count("generate_capture_reused")
            return None
        eos = [c for c in criteria if type(c).__name__ == "EosTokenCriteria"]
        try:
            with capture.capturing(self.graph):  # (no device sync: the prefill runs meanwhile)
                self._step(model, forward, kwargs, sample, processors, eos, pad)
        except capture.CaptureError as e:
            return str(e).splitlines()[0]
        self.captured = True
        model.__dict__[_STEP_POOL][key] = self
        metrics.count("generate_captured")
        return None

    def _step(self, model, forward, kwargs, sample, processors, eos, pad):
        kwargs = dict(kwargs)
        if self.mask is not None:
            kwargs["attention_mask"] = self.mask
        if self.pos is not None:
            kwargs["position_ids"] = self.pos
        inputs = model.prepare_inputs_for_generation(self.cur, next_sequence_length=1, **kwargs)
        logits = forward(**inputs, return_dict=True).logits[:, -1].to(copy=True, dtype=torch.float32)
        scores = logits
        for proc in processors:
            floor = LENGTH_FLOORS.get(type(proc).__name__)
            if floor is None:
                scores = proc(self.ids, scores)
            else:
                barred = torch.isin(torch.arange(scores.shape[-1], device=scores.device),
                                    proc.eos_token_id.to(scores.device))
                scores = torch.where(barred & (self.col < floor(proc)), -math.inf, scores)
        if sample:
            tokens = torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), 1).squeeze(1)
        else:
            tokens = torch.argmax(scores, dim=-1)
        if eos:
            tokens = tokens * self.unfinished + pad * (1 - self.unfinished)
        self.ids.index_copy_(1, self.col, tokens[:, None])
        if self.mask is not None:
            self.mask.index_fill_(1, self.col, 1)
        if self.pos is not None:
            self.pos.add_(1)
        self.cur.copy_(tokens[:, None])
        self.col.add_(1)
        for crit in eos:
            self.unfinished.mul_(~crit(tokens[:, None], None))
        if eos:
            done = self.unfinished.max() == 0
            self.stop_at.copy_(torch.where(done, torch.minimum(self.stop_at, self.col),
                                           self.stop_at))

    def run(self, length: int, max_length: int, unread):
        """Replay up to max_length, STEPS tokens a launch -> (length, cached, stop), as the
        op-by-op loop ends; each launch's stopping length is read after the next launch is
        queued."""
        stop = cached = None
        while length < max_length:
            n = min(STEPS, max_length - length)
            self.graph.replay_steps(n)
            cached, length = length + n - 1, length + n
            if self.stop_at is not None:
                unread.append((self.stop_at.clone(), None))
                if len(unread) > STOP_LAG and (stop := first_stop(unread, 1)) is not None:
                    break
            if any(time.time() - c.initial_timestamp > c.max_time for c in self.timers):
                # (as MaxTimeCriteria stops every row at this length, unless EOS did first)
                stop = first_stop(unread, len(unread)) or length
                break
        return length, cached, stop


def first_stop(unread, n: int):
    """The length at the first of the `n` oldest unread entries after which every row had
    finished (None: none had). An entry is a step's flag and its length, or a launch's
    first stopping length (`at` None). Reading one waits for its step or launch only."""
    for _ in range(n):
        done, at = unread.popleft()
        if at is None:
            if (first := int(done)) != NEVER:
                return first
        elif bool(done):
            return at
    return None


# ---------------------------------------------------------------- the fingerprint
class _Same:
    """An object compared by identity, and held, so that its id is not reused meanwhile."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return type(other) is _Same and other.obj is self.obj

    __hash__ = None


_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, torch.dtype,
                    torch.device, torch.memory_format, torch.layout})
_MAPS = frozenset({dict, collections.OrderedDict})


def fingerprint(model, forward, kwargs, processors, criteria, pad, sample, layout) -> list:
    """What the decode step of a call is recorded from (see the module doc), as a flat list:
    each container writes its type and length, then its items. `pad`: the pad token's
    X
    of `bench generate`'s Llama, against ~2.8 ms to record the step again.)"""
    from transformers import PretrainedConfig
    from transformers.cache_utils import Cache, CacheLayerMixin
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from ..eager.modes import get_eager_mode

    by_value = (PretrainedConfig, Cache, CacheLayerMixin)
    seen = set()  # ids of the objects compared by value already written (configs, caches)
    out = []
    put, extend = out.append, out.extend

    def add(v, small_values=False):
        t = type(v)
        put(t)
        if t in _PLAIN:
            put(v)
        elif t in _MAPS or isinstance(v, dict):
            put(len(v))
            for k, x in v.items():
                tx = type(x)
                # (inline: a module's attributes are mostly numbers and empty hook dicts)
                if tx in _PLAIN or (tx in _MAPS and not x):
                    extend((k, tx, x))
                else:
                    put(k)
                    add(x, small_values)
        elif t is tuple or t is list or isinstance(v, tuple):  # (torch.Size, named tuples)
            put(len(v))
            for x in v:
                add(x, small_values)
        elif isinstance(v, torch.Tensor):
            if small_values and v.numel() <= _SMALL:
                extend((v.dtype, v.shape, v.device, v.flatten().tolist()))
            else:
                extend((_Same(v.untyped_storage()), v.shape, v.stride(),
                            v.storage_offset(), v.dtype, v.requires_grad))
        elif t is types.MethodType:  # (a bound method is a new object at each lookup)
            put(_Same(v.__func__))
            add(v.__self__)
        elif (t is set or t is frozenset) and all(type(x) in _PLAIN for x in v):
            put(frozenset(v))
        elif isinstance(v, by_value) and id(v) not in seen:
            seen.add(id(v))  # (a second visit, or a cycle back to it, compares by identity)
            put(_Same(v))
            add(vars(v))
        else:
            put(_Same(v))

    put(get_eager_mode())
    out += (torch.is_grad_enabled(), torch.is_autocast_enabled("tpu"),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("tpu"), sample, pad)
    add(layout)
    add([_Same(m) for m in _get_current_function_mode_stack()])
    add([_Same(m) for m in _get_current_dispatch_mode_stack()])
    add(forward)
    for m in model.modules():
        state = vars(m)
        if m is model:
            state = {k: v for k, v in state.items() if k not in _HOST_MEMOS}
        put(_Same(m))
        add(state)
    add(kwargs)
    for obj in [*processors, *(c for c in criteria if type(c).__name__ == "EosTokenCriteria")]:
        put(type(obj))
        add(vars(obj), True)
    return out
