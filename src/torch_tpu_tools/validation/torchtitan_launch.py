"""One torchrun process of an unmodified torchtitan run: `python -m
torch_tpu_tools.validation.torchtitan_launch --device tpu|cpu --record FILE -- <torchtitan
arguments>`, started by torchtitan.py (`python -m torch_tpu validate torchtitan`).

torchtitan's files are never edited; this launcher adapts the process around them, then
runs `torchtitan.train` as `__main__`, as `python -m torchtitan.train` would:

- `--device cpu` (the gloo baseline): torchtitan takes its device from
  `torch._utils._get_available_device_type()` (`or "cuda"`), which names no device on a
  CPU-only torch; the caller sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 (so tpu is not loaded)
  and this launcher makes that function say "cpu", with `torch.cpu` plus the few memory
  calls torchtitan's DeviceMemoryMonitor makes (torch.cpu has none of them) as the device
  module. `Backend.default_device_backend_map["cpu"]` is gloo, so torchtitan picks gloo.
  flex_attention's backward, which torch refuses on CPU inputs and inductor cannot compile
  for the CPU, runs eagerly, torch's dense implementation (`_cpu_flex_attention_backward`);
  FSDP2 reduces gradients with SUM, as gloo has no PREMUL_SUM (`_gloo_gradient_reduction`).
- `--device tpu`: no device adaptation. torch_tpu is loaded by torch's device-backend
  autoload, and torchtitan picks "tpu" and "tpu_dist" by itself.
- both: `torch.distributed.set_timeout`, which 0.3.0 calls and torch 2.13.0 lacks, is
  torch's own `_set_pg_timeout` (`_set_timeout_for_older_torch`).
- `--record FILE` (both): rank 0 appends a JSON line per logged step (loss and grad norm in
  full precision, a wall-clock stamp) by wrapping `MetricsProcessor.log`, which torchtitan
  calls once per step after reading the loss back (a sync point), so stamps of consecutive
  steps bound a whole step.

This module imports torch only (never torch_tpu): it runs in the CPU baseline too.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import types


def _cpu_device_module(torch) -> types.ModuleType:
    """torch.cpu, plus what torchtitan's DeviceMemoryMonitor and init code call on a device
    module: torch.cpu.current_device() returns the string "cpu", which torchtitan passes to
    `barrier(device_ids=[...])`, so the index 0 stands in."""
    mod = types.ModuleType("torch_cpu_for_torchtitan")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    mod.current_device = lambda: 0
    mod.get_device_name = lambda device=None: "cpu"
    mod.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=total)
    mod.memory_stats = lambda device=None: {}
    mod.reset_peak_memory_stats = lambda device=None: None
    mod.empty_cache = lambda: None
    return mod


def _use_cpu() -> None:
    import torch
    import torch._utils

    module = _cpu_device_module(torch)
    get_module = torch._utils._get_device_module
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = (
        lambda device_type=None: module if device_type == "cpu" else get_module(device_type))


def _gloo_gradient_reduction() -> None:
    """torchtitan sets FSDP2's gradient divide factor (1.0, it divides by the token count
    itself), and FSDP2 then reduce-scatters with ReduceOp.PREMUL_SUM, which gloo does not
    have (nccl and tpu_dist do). FSDP2's own `force_sum_reduction_for_comms` gives the same
    sum with SUM and a division after it, skipped for a factor of 1."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc

    factors = fc._get_gradient_divide_factors

    def _get_gradient_divide_factors(group, all_reduce_group, dtype, device_type="",
                                     factor=None, force_sum_reduction_for_comms=False):
        return factors(group, all_reduce_group, dtype, device_type, factor, True)

    fc._get_gradient_divide_factors = _get_gradient_divide_factors


def _cpu_flex_attention_backward() -> None:
    """torch refuses flex_attention's backward on CPU eager inputs (`_validate_device`);
    torch_tpu lifts the same check for tpu inputs (torch_tpu._patches.FLEX_ATTENTION_DEVICE),
    and both then run torch's own dense implementation op by op, forward and backward. So
    the baseline lifts it for CPU inputs as well: the same math on both sides."""
    from torch.nn.attention import flex_attention as fa

    check = fa._validate_device

    def _validate_device(query, key, value):
        if query.device.type != "cpu":
            check(query, key, value)

    fa._validate_device = _validate_device
    # 0.3.0's FlexAttention runs `torch.compile(flex_attention, options=...)`, a class
    # attribute made at import; inductor has no CPU kernel for flex_attention's backward
    # in torch 2.13.0 (it fails compiling it), so the baseline calls flex_attention
    # eagerly: the dense implementation above. (tpu compiles it: compile/flex.py.)
    try:
        from torchtitan.models.common.attention import FlexAttention
    except ImportError:  # 0.2.2 compiles no flex_attention in its debug model
        return
    FlexAttention._compiled_flex_attn = staticmethod(fa.flex_attention)


def _set_timeout_for_older_torch() -> None:
    """torchtitan 0.3.0 calls `torch.distributed.set_timeout(timeout, group)` after the first
    step; torch 2.13.0 does not have it yet, and has the same thing as
    `distributed_c10d._set_pg_timeout(timeout, group)` (which torch_tpu extends to tpu_dist)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda timeout, group=None: c10d._set_pg_timeout(timeout, group)


def _record_steps(path: str) -> None:
    from torchtitan.components import metrics

    log = metrics.MetricsProcessor.log

    def logged(self, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs):
        if int(os.environ.get("RANK", "0")) == 0:
            with open(path, "a") as f:
                f.write(json.dumps({"step": int(step), "loss": float(global_avg_loss),
                                    "grad_norm": float(grad_norm),
                                    "time": time.perf_counter()}) + "\n")
        return log(self, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs)

    metrics.MetricsProcessor.log = logged


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="torchtitan_launch")
    p.add_argument("--device", choices=("tpu", "cpu"), required=True)
    p.add_argument("--record", default="")
    args = p.parse_args(argv[:split])
    # Before torchtitan is imported: 0.2.2's ConfigManager.parse_args takes its default,
    # `sys.argv[1:]`, when torchtitan.config is first imported.
    sys.argv = ["torchtitan.train", *argv[split + 1:]]
    if args.device == "cpu":
        _use_cpu()
        _gloo_gradient_reduction()
    _set_timeout_for_older_torch()
    if args.record:
        _record_steps(args.record)
    if args.device == "cpu":
        _cpu_flex_attention_backward()
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
