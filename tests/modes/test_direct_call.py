"""Strict's direct call of a compiled op program (csrc/direct.cpp, _runtime.direct_call)
against its Python reference, the jax.jit function it stands for: same values, dtypes,
shapes and weak types; every case outside the plain one falls back to jit, counted; the
C fast path switched off keeps jit's own call."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu import _C, _dispatch, _program_cache, metrics
from torch_tpu.op import asserts

CASES = {
    "add": (torch.ops.aten.add.Tensor, lambda d: (torch.randn(5, 3, device=d), torch.randn(3, device=d))),
    "mm": (torch.ops.aten.mm.default, lambda d: (torch.randn(4, 6, device=d), torch.randn(6, 2, device=d))),
    "softmax": (torch.ops.aten._softmax.default, lambda d: (torch.randn(3, 7, device=d), -1, False)),
    "max.dim": (torch.ops.aten.max.dim, lambda d: (torch.randn(4, 5, device=d), 1)),
    "index_select": (torch.ops.aten.index_select.default,
                     lambda d: (torch.randn(6, 2, device=d), 0, torch.tensor([5, 0, 2], device=d))),
    "bf16 mul scalar": (torch.ops.aten.mul.Tensor,
                        lambda d: (torch.randn(8, device=d, dtype=torch.bfloat16), 0.5)),
    "add_": (torch.ops.aten.add_.Tensor, lambda d: (torch.randn(4, device=d), torch.randn(4, device=d))),
}


def _entry_args(op, make):
    """Run the op twice on tpu (the first call installs the direct call); -> its cached
    entry, and the program's arguments as Strict passes them."""
    plan = _dispatch.plan_for(op)
    torch.manual_seed(0)
    for _ in range(2):
        args = make("tpu")
        op(*args)
    torch.tpu.synchronize()  # (a new program's first call runs at the compile window's sync)
    key, bufs, dyns = _C.scan(plan, list(_normalized(plan, args)))
    # (looked up, not plan.cache cleared first: the program cache's LRU holds its entries)
    entry = _program_cache.op_entry(plan, key, None, True)
    # an op with index arguments also takes the device-side asserts' chain value, last
    chain = list(asserts.unlinked()) if entry.checks is not None else []
    return entry, [*bufs, *dyns, *chain], args


def _normalized(plan, args):
    from torch_tpu.op.opcall import normalize

    return normalize(plan, args, {})


@pytest.mark.parametrize("name", CASES)
def test_direct_call_matches_the_jitted_reference(name):
    op, make = CASES[name]
    entry, args, _ = _entry_args(op, make)
    assert type(entry.fn) is _C.DirectCall, "jaxlib 0.10.2's executable should be called directly"
    direct = entry.fn(*args)
    reference = entry.fn.jitted(*args)
    assert len(direct) == len(reference)
    for d, r in zip(direct, reference):
        assert (d.shape, d.dtype, d.weak_type) == (r.shape, r.dtype, r.weak_type)
        np.testing.assert_array_equal(np.asarray(d), np.asarray(r))


def test_cases_outside_the_plain_one_fall_back_to_jit():
    entry, args, _ = _entry_args(*CASES["add"])
    before = metrics.counters["direct.fallbacks"]
    host = [np.asarray(a) for a in args]  # not jax.Arrays: jit places them
    np.testing.assert_array_equal(np.asarray(entry.fn(*host)[0]), np.asarray(entry.fn.jitted(*args)[0]))
    assert metrics.counters["direct.fallbacks"] == before + 1
    gone = jax.numpy.array(np.asarray(args[0]))
    gone.delete()
    # another argument count; a deleted buffer, which the executable refuses: jit's errors
    for bad in (args[:1], [gone, *args[1:]]):
        with pytest.raises(Exception) as direct:
            entry.fn(*bad)
        with pytest.raises(type(direct.value)) as reference:
            entry.fn.jitted(*bad)
        assert str(direct.value) == str(reference.value)
    assert "deleted" in str(direct.value)
    assert metrics.counters["direct.fallbacks"] == before + 3


_SCRIPT = r"""
import json, torch, torch_tpu
from torch_tpu import metrics
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(32, 8).to("tpu"), torch.randn(32, 1).to("tpu")
losses = []
for _ in range(4):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "programs": metrics.counters["direct.programs"],
                  "fallbacks": metrics.counters["direct.fallbacks"]}))
"""


@pytest.mark.slow
def test_training_is_the_same_with_direct_calls_off():
    runs = {}
    for fast in ("1", "0"):
        env = dict(os.environ, TORCH_TPU_C_FAST_PATH=fast)
        out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[fast] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["1"]["losses"] == runs["0"]["losses"]
    assert runs["1"]["programs"] > 10 and runs["1"]["fallbacks"] == 0
    assert runs["0"]["programs"] == 0
