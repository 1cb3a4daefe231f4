"""The model-zoo sweep: every model type of transformers' causal-LM, masked-LM,
sequence-classification, image-classification and base mappings, shrunk to a tiny config
(shrink.py), with random weights, offline.

Each type is built once, for the first of those tasks it has (in that order). The forward
runs on CPU, then the same module, moved to tpu, runs it again in the chosen mode (an
eager mode, or "compiled": torch.compile(model, backend="tpu") in Strict), and the main
output (the logits; a base model's last hidden state) is compared. Then one training
step (training.py: forward, the head's loss, backward, AdamW) runs on CPU in float32 and
float64 and on tpu, and the output, loss, every gradient and every parameter after the
step are judged against float64 as PyTorch judges backends. Models whose forward draws
random numbers are judged on the forward's statistics only. Failures are recorded with
their error class.
"""
from __future__ import annotations

import copy
import gc
import time

import torch

from .. import workloads
from . import compare, inputs, selection, shrink, tolerances, training, variants
from .ops import _SeededOps, classify, time_limit, _Timeout

TASKS = [  # (task, mapping name), in the order a model type's task is chosen
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("seq-cls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("image-cls", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
]

# what a stored result was judged by: `validate models --resume` reruns the others
HARNESS = "forward + training step, float64 judge (2026-12-07)"
# a shrunk model above this many parameters is not worth its time on CPU
MAX_PARAMS = 120_000_000


def model_types() -> dict:
    """model type -> (task, architecture class name), for every type of the five mappings."""
    workloads.offline()
    from transformers.models.auto import modeling_auto

    chosen: dict = {}
    for task, mapping in TASKS:
        for mt, cls in getattr(modeling_auto, mapping).items():
            if mt not in chosen:
                chosen[mt] = (task, cls if isinstance(cls, str) else cls[0])
    return dict(sorted(chosen.items()))


def main_output(out):
    """The tensor a model's user reads: its logits, or for a base model its hidden state
    (the first floating tensor; an integer one where there is none)."""
    for key in ("logits", "last_hidden_state", "prediction_logits", "logits_per_image",
                "pooler_output", "audio_values", "reconstruction", "image_embeds"):
        # (a ModelOutput is a dict: its fields are its keys)
        v = out.get(key) if isinstance(out, dict) else getattr(out, key, None) \
            if not isinstance(out, tuple) else None
        if isinstance(v, torch.Tensor):
            return key, v
    seq = out.to_tuple() if hasattr(out, "to_tuple") else out
    leaves = [(i, v) for i, v in enumerate(compare.leaves(seq)) if isinstance(v, torch.Tensor)]
    for i, v in leaves:
        if v.is_floating_point():
            return f"out[{i}]", v
    if leaves:  # discrete codes (an audio tokenizer's encoder): compared exactly
        return f"out[{leaves[0][0]}]", leaves[0][1]
    raise TypeError(f"no tensor in the output ({type(out).__name__})")


class Unsupported(Exception):
    """A variant the type's config class has no field for, or rejects."""


def _config(model_type: str, level: str, variant: str | None):
    from huggingface_hub.errors import StrictDataclassError
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    default = CONFIG_MAPPING[model_type]()
    if variant is None:
        return shrink.shrink(default, level)
    d = variants.config_dict(default.to_dict(), variant)
    if d is None:
        raise Unsupported(f"{type(default).__name__} has no field for {variant}, or its "
                          f"default already is it")
    try:
        return shrink.rebuilt(default, d)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as e:  # its validation
        raise Unsupported(f"{type(default).__name__} rejects {variant}: "
                          f"{type(e).__name__}: {_first_line(e)}") from e


def _build(model_type: str, cls_name: str, task: str, level: str, variant=None):
    import transformers

    config = _config(model_type, level, variant)
    if getattr(config, "pad_token_id", "absent") is None:
        # batches of 2 need a pad token (sequence classifiers find each row's last token;
        # ESM masks padding); the inputs never contain it (inputs.ids draws from 3 up)
        config.pad_token_id = 0
    cls = getattr(transformers, cls_name)
    want = getattr(cls, "config_class", None)
    if want is not None and not isinstance(config, want):
        # a text-only head of a multimodal type (Llama4ForCausalLM) takes the text config
        sub = next((v for v in vars(config).values() if isinstance(v, want)), None)
        config = sub if sub is not None else config
    try:  # count on the meta device first: a model too big to build is never built
        with torch.device("meta"):
            n = sum(p.numel() for p in cls(config).parameters())
    except Exception:
        n = 0
    if n > MAX_PARAMS:
        raise MemoryError(f"{n / 1e6:.0f}M parameters after shrinking")
    torch.manual_seed(0)
    model = _untied(cls(config).eval())
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise MemoryError(f"{n / 1e6:.0f}M parameters after shrinking")
    return config, model, n


def _untied(model):
    """Parameters that the init leaves constant (a zero router, zero biases, unit norms)
    get seeded noise (std 0.02) around their value. A zero router ties every expert's
    score, and which of tied experts top-k picks is each kernel's own choice (CPU's picks
    the last, XLA's the first): the comparison would judge tie-breaking, not lowerings."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            flat = p.detach().reshape(-1)
            if p.is_floating_point() and flat.numel() > 1 and bool((flat == flat[0]).all()):
                p.add_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _forward(model, kwargs):
    # No autograd graph: one would keep references to the parameters, and moving a module
    # to tpu swaps each parameter in place, which torch refuses for a referenced tensor.
    with torch.no_grad():
        return model(**kwargs)


def _run_cpu(model, config, dtype=torch.float32):
    """(label, kwargs, output, seeded, top-k choices) of the first input set that runs,
    its floating inputs in `dtype`."""
    err = None
    for label, kw in inputs.candidates(model, config):
        kw = {k: v.to(dtype) if v.is_floating_point() else v for k, v in kw.items()}
        watch, picks = _SeededOps(), selection.Selections()
        try:
            with watch, picks:
                out = _forward(model, kw)
            main_output(out)
        except Exception as e:  # the next input set may suit the model better
            err = err or e  # the most likely input set's error is the one to report
            continue
        return label, kw, out, watch.seeded, picks.calls
    raise err if err is not None else TypeError("no input set fits the forward signature")


def _train_cpu(model, config, task, kw):
    """(label kwargs, CPU float32's step, float64's step or None, the step's top-k
    choices), or None when no step runs on CPU (the head's loss, then a projection of the
    output, are tried)."""
    tried = [training.labels(task, config, kw)]
    if tried[0]:
        tried.append({})
    for label_kw in tried:
        wide, picks = _in_float64(model, kw), selection.Selections()
        try:
            with picks:
                step = training.step(model, kw, label_kw, main_output)
        except Exception:  # noqa: BLE001  (the next loss may suit the head)
            continue
        if wide is not None:
            try:
                wide = training.step(wide[0], wide[1], label_kw, main_output)
            except Exception:  # noqa: BLE001  (no float64 reference: fixed tolerances)
                wide = None
        return label_kw, step, wide, picks.calls
    return None


def _in_float64(model, kw):
    try:
        return training.in_float64(model, kw)
    except Exception:  # noqa: BLE001
        return None


def _twin(model):
    try:
        return copy.deepcopy(model)
    except Exception:  # noqa: BLE001  (a model that cannot be copied runs as it is)
        return model


def check_model(model_type: str, task: str, cls_name: str, mode: str,
                timeout: float | None = 600, cpu_only: bool = False, on_tpu=None,
                variant: str | None = None) -> dict:
    """{'status': 'pass' | 'mismatch' | 'tpu_error' | 'cpu_fail' | 'timeout', ...};
    with `cpu_only`, 'cpu_ok' once the CPU side runs (to work on the shrinker). With a
    `variant` (variants.py), that real-config variant instead of the shrink levels;
    'unsupported' where the config has no field for it."""
    import torch_tpu

    res = {"task": task, "arch": cls_name, "harness": HARNESS}
    dtype = getattr(torch, variants.DTYPES.get(variant, "float32"))
    t0 = time.perf_counter()
    try:
        with time_limit(timeout, model_type):
            errors = []
            for level in shrink.LEVELS if variant is None else ("real",):
                try:
                    config, model, n = _build(model_type, cls_name, task, level, variant)
                    if dtype != torch.float32:  # (models keep float64 buffers of their own)
                        model = model.to(dtype)
                    # tpu runs a twin untouched by the CPU run: models cache tensors
                    # derived from buffers on first use (Mimi's codebook), which a
                    # later .to() does not move
                    twin = _twin(model)
                    label, kw, out, seeded, picks = _run_cpu(model, config, dtype)
                    break
                except _Timeout:
                    raise
                except Unsupported as e:
                    return {**res, "status": "unsupported", "detail": str(e),
                            "seconds": _since(t0)}
                except Exception as e:
                    errors.append((level, e))
                    model = None
            else:
                level, e = errors[0]  # the error of the tiny config, the harness's own
                tried = {lv: f"{type(x).__name__}: {_first_line(x)}" for lv, x in errors}
                return {**res, "status": "cpu_fail", "error": type(e).__name__,
                        "detail": _first_line(e), "tried": tried, "seconds": _since(t0)}
            res.update(level=level, params=n, inputs=label, random=seeded)
            if cpu_only:
                return {**res, "status": "cpu_ok", "seconds": _since(t0)}
            train = None if seeded else _train_cpu(model, config, task, kw)
            key, want = main_output(out)
            want = want.detach().cpu()
            if on_tpu is not None:
                on_tpu()
            tol = tolerances.MODEL_LOGITS if dtype == torch.float32 else tolerances.grad(dtype)
            # (compiled runs take tpu's own choices: dynamo traces a TorchFunctionMode that
            # is active at the call, and there mis-binds Mixtral router's arange arguments)
            follow = mode != "compiled"
            tpu_picks = [selection.following(picks if follow else None, tol),
                         selection.following(train[3] if follow and train else None, tol)]
            try:
                cpu_model = model
                if mode == "compiled":
                    torch._dynamo.reset()  # each type's graphs on their own
                with torch_tpu.eager_mode("strict" if mode == "compiled" else mode):
                    model = twin.to("tpu")
                    run = torch.compile(model, backend="tpu") if mode == "compiled" else model
                    kw_t = {k: v.to("tpu") for k, v in kw.items()}
                    with tpu_picks[0]:
                        got = main_output(_forward(run, kw_t))[1].detach().cpu()
                    with tpu_picks[1]:
                        got_step = None if train is None else training.step(
                            model, kw_t, {k: v.to("tpu") for k, v in train[0].items()},
                            main_output, run)
            except _Timeout:
                raise
            except Exception as e:
                c = classify(e)
                return {**res, "status": "tpu_error", "error": type(e).__name__, **c,
                        "seconds": _since(t0)}
            if seeded and want.shape != got.shape and _random_shape(cpu_model, kw, want):
                # the output's size is drawn at random on CPU too (VITS's durations)
                reason = None if (want.dtype, want.dim()) == (got.dtype, got.dim()) else \
                    f"{key}: {got.dtype} {got.dim()}-d != cpu {want.dtype} {want.dim()}-d"
            elif seeded:
                reason = compare.statistics_close([want], got)
            else:
                reason = compare.tensor_close(want, got, *tol, key)
                if reason and train is not None and train[2] is not None:
                    # bf16 logits, which differ by rounding through every layer, and
                    # forwards CPU's own float32 is as far from float64 on (detectors'
                    # top-k query selection): judged against the float64 step's output
                    reason = training.judged(train[2]["out"], want, got, key)
            if reason is None and train is not None:
                reason = training.compare_steps(train[1], got_step, train[2])
            aligned = sum(p.aligned for p in tpu_picks)
            if aligned:
                res["topk_as_cpu"] = aligned
            res["train"] = "none" if train is None else \
                f"{'labels' if train[0] else 'projection'}, " + \
                ("float64" if train[2] is not None else "float32 tolerances")
            if reason:
                return {**res, "status": "mismatch", "error": "Mismatch", "detail": reason,
                        "seconds": _since(t0)}
            return {**res, "status": "pass", "seconds": _since(t0)}
    except _Timeout as e:
        return {**res, "status": "timeout", "error": "Timeout", "detail": str(e),
                "seconds": _since(t0)}
    finally:
        model = cpu_model = twin = None
        gc.collect()


def _random_shape(model, kw, want) -> bool:
    """Whether another CPU run, with another seed, gives an output of another shape."""
    torch.manual_seed(12345)
    with torch.no_grad():
        return main_output(_forward(model, kw))[1].shape != want.shape


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else "")[:200]


def _since(t0) -> float:
    return round(time.perf_counter() - t0, 1)


def timm_status() -> str:
    """Why timm models are or are not in the sweep."""
    try:
        import timm  # noqa: F401
    except Exception as e:
        return f"not run: `import timm` fails here ({type(e).__name__}: {_first_line(e)})"
    return "importable"


def sweep(types: dict, mode: str, timeout: float | None = 600, progress=None,
          on_result=None, cpu_only: bool = False) -> dict:
    """In this process; cli.py runs the same units through worker.run_isolated."""
    """model type -> verdict, for each (task, class name) of `types`."""
    workloads.offline()
    results = {}
    for mt, (task, cls_name) in types.items():
        if progress is not None:
            progress.set_postfix_str(mt, refresh=False)
        r = check_model(mt, task, cls_name, mode, timeout, cpu_only)
        results[mt] = r
        if on_result is not None:
            on_result(mt, r)
        if progress is not None:
            progress.update(1)
    return results
