"""DTensor attention on tpu: `F.scaled_dot_product_attention` on DTensors gives the
single-process result, forward and backward, under a tensor-parallel plan and under
FSDP2 + TP on a small HF Llama.

The jobs run under torchrun on 127.0.0.1; this file is also the worker
(`torchrun ... tests/distributed/test_dtensor_attention.py --worker SCENARIO`), a user script whose
ranks each write their results (helpers.dist_launch.report). Unlike examples/tp.py (whose plan hands plain
local tensors to attention), the plans here keep DTensors through attention
(`use_local_output=False`), so SDPA itself runs on DTensors: torch's fused-attention
"overrideable" op, with the sharding strategies of torch_tpu/distributed/_dtensor.py.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from helpers.dist_launch import EXAMPLES, HERE, SRC  # noqa: E402


def torchrun(nproc: int, scenario: str, timeout: float) -> tuple[int, str, list]:
    """Run this file's worker under torchrun; -> (exit code, output, each rank's result)."""
    import json

    from helpers.dist_launch import free_port

    out_dir = tempfile.mkdtemp(prefix="tpu_dtensor_test_")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", WORKER_DEADLINE_S=str(int(timeout)),
               TPU_DIST_TEST_OUT=out_dir,
               PYTHONPATH=os.pathsep.join([EXAMPLES, SRC, HERE, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           os.path.abspath(__file__), "--worker", scenario]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout + 30)  # the workers' own alarm comes first
    except subprocess.TimeoutExpired:
        p.terminate()  # torchrun stops its workers (they run in sessions of their own)
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
    paths = [os.path.join(out_dir, f"result{rank}.json") for rank in range(nproc)]
    results = []
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    return p.returncode, out, results


# ---------------------------------------------------------------- the tests
def test_dtensor_internals_match():
    """The DTensor internals _dtensor.py calls are the ones torch 2.13.0 has; a torch
    upgrade that changes them fails here, by name, instead of silently unregistering."""
    from torch_tpu.distributed import _dtensor

    assert _dtensor.check_internals() == []


def test_internals_check_catches_a_change(monkeypatch):
    import torch.distributed.tensor._ops.utils as utils

    from torch_tpu.distributed import _dtensor

    def expand_to_full_mesh_op_strategy(mesh, op_schema, single_mesh_dim_strategies, *,
                                        input_index=1):  # no is_valid_strategy_cb
        return None

    monkeypatch.setattr(utils, "expand_to_full_mesh_op_strategy", expand_to_full_mesh_op_strategy)
    problems = _dtensor.check_internals()
    assert len(problems) == 1 and "is_valid_strategy_cb" in problems[0], problems


@pytest.mark.slow  # a fresh process
def test_registered_lazily():
    """`import torch` loads torch_tpu but not DTensor (~2 s); the strategies go in when the
    user imports torch.distributed.tensor, and leave the import machinery as it was."""
    code = (
        "import sys, torch\n"
        "assert 'torch_tpu.distributed' in sys.modules\n"
        "assert 'torch.distributed.tensor' not in sys.modules\n"
        "from torch.distributed.tensor import DTensor\n"
        "import torch.distributed.tensor as t\n"
        "from torch_tpu.distributed import _dtensor\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "assert funcs[_dtensor.FORWARD] is _dtensor._forward_strategy\n"
        "assert funcs[_dtensor.BACKWARD] is _dtensor._backward_strategy\n"
        "from torch_tpu import _on_import\n"
        "assert not _on_import.waiting('torch.distributed.tensor')\n"
        "from torch.distributed.tensor._dispatch import OpDispatcher\n"
        "assert not hasattr(OpDispatcher.wrap, '_tpu_patch')  # DTensor runs unpatched\n"
        "assert type(t.__loader__).__name__ == 'SourceFileLoader', t.__loader__\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


@pytest.mark.distributed
@pytest.mark.slow
def test_sdpa_on_dtensors():
    """Heads-sharded (a TP plan over an attention module), batch-sharded and replicated
    DTensors, with causal, grouped-query, bool-mask and learned float-bias attention:
    outputs and every gradient equal the single-process run on tpu and on CPU."""
    code, out, results = torchrun(2, "sdpa", timeout=420)
    assert code == 0 and len(results) == 2, out[-8000:]
    for r in results:
        for name, case in r["cases"].items():
            assert case["vs_tpu"] <= 1e-5, (name, case)
            assert case["vs_cpu"] <= 1e-5, (name, case)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_fsdp2_tp_llama(nproc):
    """FSDP2 x TP on a (dp, tp) mesh, (1, 2) or (2, 2), a 2-layer HF Llama with sdpa
    attention and grouped-query heads: the losses equal one process training on the
    whole batch on CPU."""
    code, out, results = torchrun(nproc, "llama", timeout=600)
    assert code == 0 and len(results) == nproc, out[-8000:]
    for r in results:
        assert r["dtensor_attention"], r
        assert r["max_rel_diff"] <= 1e-5, r
        assert r["mesh_2d_sdpa"] <= 1e-5, r


# ---------------------------------------------------------------- the worker (user code)
def _worker(scenario: str) -> None:
    signal.alarm(int(os.environ.get("WORKER_DEADLINE_S", "600")))  # a hung job ends
    import torch.distributed as dist

    import torch_tpu  # noqa: F401  (the tpu device and the tpu_dist backend)
    from helpers.dist_launch import report

    dist.init_process_group("tpu_dist")
    result = {"rank": dist.get_rank()}
    t0 = time.monotonic()
    if scenario == "sdpa":
        result["cases"] = _sdpa_cases()
    elif scenario == "llama":
        result.update(_llama_fsdp2_tp())
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    result["seconds"] = round(time.monotonic() - t0, 1)
    report(result)
    dist.barrier()
    dist.destroy_process_group()


def _attention_module():
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        """Multi-head attention written as for CUDA: projections, SDPA, output."""

        def __init__(self, dim: int, heads: int, kv_heads: int):
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
            self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

        def forward(self, x, mask=None):
            B, S, _ = x.shape
            q = self.q_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=self.kv_heads != self.heads)
            self.attended = y
            return self.o_proj(y.transpose(1, 2).reshape(B, S, -1))

    return Attention


def _max_diff(a, b) -> float:
    from torch.distributed.tensor import DTensor

    if isinstance(a, DTensor):
        a = a.full_tensor()
    return (a.detach().cpu().float() - b.detach().cpu().float()).abs().max().item()


def _sdpa_cases() -> dict:
    import copy

    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    world = torch.distributed.get_world_size()
    mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
    Attention = _attention_module()
    B, S, D, H = 2, 8, 32, 4
    cases = {}

    def masks(kind):
        g = torch.Generator().manual_seed(3)
        if kind == "bool":  # per-example keep masks (padding-like), the diagonal kept
            keep = torch.rand(B, 1, S, S, generator=g) > 0.4
            return keep | torch.eye(S, dtype=torch.bool)
        if kind == "bias":  # a learned bias shared by batch and heads, as ALiBi/T5 have
            return (0.5 * torch.randn(1, 1, S, S, generator=g)).requires_grad_()
        return None

    # 1) the tensor-parallel plan: each rank computes its own heads
    for name, kv, mask_kind in (("tp_causal", H, None), ("tp_gqa", 2, None),
                                ("tp_bool_mask", H, "bool"), ("tp_float_bias", H, "bias")):
        torch.manual_seed(0)
        ref = Attention(D, H, kv)
        x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(1))
        mask = masks(mask_kind)
        runs = {}
        for where in ("cpu", "tpu"):  # the single-process results
            m = copy.deepcopy(ref).to(where)
            xi = x.to(where, copy=True).requires_grad_()
            mi = None if mask is None else mask.detach().to(where).requires_grad_(mask.requires_grad)
            out = m(xi, mi)
            out.square().sum().backward()
            runs[where] = (out, xi.grad, {n: p.grad for n, p in m.named_parameters()},
                           None if mi is None or mi.grad is None else mi.grad)
        tp = copy.deepcopy(ref).to("tpu")
        parallelize_module(tp, mesh, {"q_proj": ColwiseParallel(use_local_output=False),
                                      "k_proj": ColwiseParallel(use_local_output=False),
                                      "v_proj": ColwiseParallel(use_local_output=False),
                                      "o_proj": RowwiseParallel()})
        xi = x.to("tpu").requires_grad_()
        mi = None
        if mask is not None:
            mi = distribute_tensor(mask.detach().to("tpu"), mesh, [Replicate()])
            mi.requires_grad_(mask.requires_grad)
        out = tp(xi, mi)
        out.square().sum().backward()
        y = tp.attended
        assert isinstance(y, DTensor) and y.placements == (Shard(1),), y
        assert y.to_local().shape[1] == H // world, y.to_local().shape
        assert "Overrideable" in y.grad_fn.name(), y.grad_fn.name()
        got = (out, xi.grad, {n: p.grad for n, p in tp.named_parameters()},
               None if mi is None else mi.grad)
        cases[name] = {k: max(_compare(got, runs[k])) for k in ("cpu", "tpu")}

    # 2) q, k, v as DTensors sharded by batch, and replicated
    g = torch.Generator().manual_seed(2)
    qkv = [torch.randn(B * world, H, S, 16, generator=g) for _ in range(3)]
    bias = torch.randn(B * world, 1, S, S, generator=g)
    for name, placement, use_bias in (("batch_causal", Shard(0), False),
                                      ("batch_bias", Shard(0), True),
                                      ("replicate_bias", Replicate(), True)):
        runs = {}
        for where in ("cpu", "tpu"):
            ins = [t.to(where, copy=True).requires_grad_() for t in qkv]
            b = bias.to(where, copy=True).requires_grad_() if use_bias else None
            out = F.scaled_dot_product_attention(*ins, attn_mask=b, is_causal=not use_bias)
            out.square().sum().backward()
            runs[where] = (out, None, {str(i): t.grad for i, t in enumerate(ins)},
                           None if b is None else b.grad)
        ins = [distribute_tensor(t.to("tpu"), mesh, [placement]).requires_grad_() for t in qkv]
        b = (distribute_tensor(bias.to("tpu"), mesh, [placement]).requires_grad_()
             if use_bias else None)
        out = F.scaled_dot_product_attention(*ins, attn_mask=b, is_causal=not use_bias)
        assert out.placements == (placement,), out.placements
        assert "Overrideable" in out.grad_fn.name(), out.grad_fn.name()
        out.square().sum().backward()
        got = (out, None, {str(i): t.grad for i, t in enumerate(ins)},
               None if b is None else b.grad)
        cases[name] = {k: max(_compare(got, runs[k])) for k in ("cpu", "tpu")}
    return {n: {"vs_cpu": c["cpu"], "vs_tpu": c["tpu"]} for n, c in cases.items()}


def _compare(got, want) -> list:
    """Max abs differences: output, input grad, each parameter grad, mask grad."""
    diffs = [_max_diff(got[0], want[0])]
    if want[1] is not None:
        diffs.append(_max_diff(got[1], want[1]))
    for name, grad in want[2].items():
        diffs.append(_max_diff(got[2][name], grad))
    if want[3] is not None:
        diffs.append(_max_diff(got[3], want[3]))
    return diffs


def _llama_fsdp2_tp() -> dict:
    import argparse

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput,
                                                   RowwiseParallel, parallelize_module)

    import common  # examples/common.py: the model, the batches, the CPU reference

    world = torch.distributed.get_world_size()
    tp, dp = 2, world // 2
    mesh = init_device_mesh("tpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    args = argparse.Namespace(model="llama", steps=3, batch=4, lr=1e-2)
    kv_heads = 2  # 4 query heads: one kv head and two query heads per tp rank
    model = common.build(args.model, kv_heads).to("tpu")

    # q/k/v stay DTensors (sharded by heads) through rotary embedding and SDPA, so the
    # rotary cos/sin become replicated DTensors; the MLP hands local tensors on.
    parallelize_module(model.model.rotary_emb, mesh["tp"], PrepareModuleOutput(
        output_layouts=(Replicate(), Replicate()),
        desired_output_layouts=(Replicate(), Replicate()), use_local_output=False))
    plan = {"self_attn.q_proj": ColwiseParallel(use_local_output=False),
            "self_attn.k_proj": ColwiseParallel(use_local_output=False),
            "self_attn.v_proj": ColwiseParallel(use_local_output=False),
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    seen = []
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], plan)
        layer.self_attn.o_proj.register_forward_pre_hook(
            lambda mod, inputs: seen.append(isinstance(inputs[0], DTensor)))
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    dp_rank = mesh.get_local_rank("dp")
    losses = []
    for x in common.batches(args.steps, args.batch):
        x = common.shard(x, dp_rank, dp).to("tpu")
        loss = model(input_ids=x, labels=x, use_cache=False).loss  # a cache of DTensors
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(common.global_loss(loss, mesh.get_group("dp")))
    ref = common.reference(args, kv_heads)
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, ref))
    return {"losses": losses, "reference": ref, "max_rel_diff": worst,
            "dtensor_attention": bool(seen) and all(seen), "mesh_2d_sdpa": _sdpa_2d(mesh)}


def _sdpa_2d(mesh) -> float:
    """SDPA on the (dp, tp) mesh itself: the batch split over dp and the heads over tp.
    -> the max abs difference from CPU (output and q, k, v gradients)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import Shard, distribute_tensor

    g = torch.Generator().manual_seed(4)
    qkv = [torch.randn(2 * mesh.size(0), 4, 8, 16, generator=g) for _ in range(3)]
    ins = [t.clone().requires_grad_() for t in qkv]
    out = F.scaled_dot_product_attention(*ins, is_causal=True)
    out.square().sum().backward()
    dins = [distribute_tensor(t.to("tpu"), mesh, [Shard(0), Shard(1)]).requires_grad_()
            for t in qkv]
    dout = F.scaled_dot_product_attention(*dins, is_causal=True)
    assert dout.placements == (Shard(0), Shard(1)), dout.placements
    dout.square().sum().backward()
    return max([_max_diff(dout, out)] + [_max_diff(a.grad, b.grad) for a, b in zip(dins, ins)])


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "--worker":
    _worker(sys.argv[2])
