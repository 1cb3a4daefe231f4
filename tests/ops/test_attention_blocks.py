"""Fused attention computed a block pair at a time (lowering/attention.py): lengths that span
several query and key blocks, ragged last blocks, causal with more or fewer queries than
keys, bool masks with fully masked rows, float masks with -inf and their gradient,
grouped-query heads and bfloat16, forward and backward against CPU's SDPA, in each mode.
On the CPU platform the unmasked cases run ATen's flash kernels (_cpu_kernels.py); the
blocked lowering, which TPU and GPU run, is the one these cases check with
TORCH_TPU_CPU_ATEN_KERNELS=0 (`test_blocked_lowering_without_aten_kernels` reruns them)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

CASES = {
    # name: (L, S, heads, kv heads, causal, mask kind, dtype)
    "causal-multi-block": (300, 300, 4, 4, True, None, torch.float32),
    "causal-fewer-queries": (70, 200, 2, 2, True, None, torch.float32),
    "causal-more-queries": (200, 70, 2, 2, True, None, torch.float32),
    "full-ragged": (130, 190, 2, 2, False, None, torch.float32),
    "bool-mask-empty-rows": (150, 150, 2, 2, False, "bool", torch.float32),
    "float-mask-with-grad": (150, 140, 2, 2, False, "float", torch.float32),
    "gqa-causal": (160, 160, 4, 2, True, None, torch.float32),
    "bf16-causal": (192, 192, 2, 2, True, None, torch.bfloat16),
}


def _inputs(L, S, H, Hkv, mask, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, L, 16, generator=g)
    k, v = (torch.randn(2, Hkv, S, 16, generator=g) for _ in range(2))
    m = None
    if mask == "bool":
        m = torch.rand(2, 1, L, S, generator=g) > 0.3
        m[:, :, 7] = False                 # rows that see no key: zeros, no NaN
    elif mask == "float":
        m = torch.randn(1, H, L, S, generator=g)
        m[..., :5, 100:] = float("-inf")
    return [x.to(dtype) for x in (q, k, v)] + [m]


def _run(dev, q, k, v, m, causal, gqa):
    leaves = [x.detach().clone().to(dev).requires_grad_() for x in (q, k, v)]
    mask = None
    if m is not None:
        mask = m.detach().clone().to(dev)
        if mask.is_floating_point():
            mask.requires_grad_()
            leaves.append(mask)
    o = F.scaled_dot_product_attention(*leaves[:3], attn_mask=mask, is_causal=causal,
                                       enable_gqa=gqa)
    (o.float() * torch.linspace(-1, 1, o.shape[-1], device=dev)).sum().backward()
    return [o.detach().cpu()] + [x.grad.cpu() for x in leaves]


@pytest.mark.parametrize("name", list(CASES))
def test_blocked_attention_matches_cpu(eager, name):
    L, S, H, Hkv, causal, mask, dtype = CASES[name]
    q, k, v, m = _inputs(L, S, H, Hkv, mask, dtype)
    want = _run("cpu", q, k, v, m, causal, H != Hkv)
    got = _run("tpu", q, k, v, m, causal, H != Hkv)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    for g, w in zip(got, want):
        assert not g.float().isnan().any()
        torch.testing.assert_close(g.float(), w.float(), **tol)


@pytest.mark.slow
def test_blocked_lowering_without_aten_kernels():
    env = {**os.environ, "TORCH_TPU_CPU_ATEN_KERNELS": "0"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
           f"{__file__}::test_blocked_attention_matches_cpu"]
    proc = subprocess.run(cmd,
                          env=env, capture_output=True, text=True, timeout=900, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-2000:]
