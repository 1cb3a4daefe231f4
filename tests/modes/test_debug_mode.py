"""Debug eager mode: every op waits, NaN/Inf is blamed on the op that made it and the
user's line, out-of-range indices raise instead of clamping, and the CPU shadow catches a
wrong lowering. Every error leaves the process and the mode working."""
import copy
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import _dispatch, _storage, metrics
from torch_tpu.eager.debug import (TpuCpuMismatchError, TpuDebugError, TpuIndexError,
                                   TpuNonFiniteError)
from torch_tpu.lowering import registry

HERE = os.path.basename(__file__)


@pytest.fixture
def debug(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_DEBUG_CPU_CHECK", raising=False)
    monkeypatch.delenv("TORCH_TPU_DEBUG_NAN_CHECK", raising=False)
    monkeypatch.delenv("TORCH_TPU_DEBUG_INF_CHECK", raising=False)
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEBUG):
        yield


def _op_line():
    """Where the op under test is written: two lines below the caller's, inside the
    `with pytest.raises(...)` block that follows it."""
    return f"{HERE}:{sys._getframe(1).f_lineno + 2}"


def _tpu(*values, dtype=None):
    return torch.tensor(values, dtype=dtype).to("tpu")


# ---------------------------------------------------------------- NaN / Inf
def test_nan_from_log_names_op_and_line(debug):
    x = _tpu(1.0, -1.0, 2.0)
    line = _op_line()
    with pytest.raises(TpuNonFiniteError) as e:
        torch.log(x)
    msg = str(e.value)
    assert "aten::log" in msg and line in msg and "NaN" in msg, msg
    assert "torch.log(x)" in msg  # the source line is quoted
    # the process and the mode keep working
    assert torch_tpu.get_eager_mode() is torch_tpu.EagerMode.DEBUG
    torch.testing.assert_close(torch.log(x.abs()).cpu(), torch.log(torch.tensor([1.0, 1.0, 2.0])))


def test_inf_from_finite_inputs_raises_when_asked_and_is_a_runtime_error(debug, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEBUG_INF_CHECK", "1")
    line = _op_line()
    with pytest.raises(RuntimeError, match="aten::div") as e:
        _tpu(1.0, 2.0) / _tpu(0.0, 1.0)
    assert isinstance(e.value, TpuDebugError) and line in str(e.value)


def test_infinities_models_make_on_purpose_pass_by_default(debug):
    """T5's relative-position buckets take log(0) and mask it with a where; GPT-Neo adds
    two finfo.min masks, which overflow to -inf before a softmax. A CUDA run never stops
    there, and Debug does not either unless TORCH_TPU_DEBUG_INF_CHECK asks it to."""
    rel = _tpu(0.0, 1.0, 4.0, 9.0)
    buckets = torch.where(rel < 2, rel, torch.log(rel / 2) * 3)
    assert torch.isfinite(buckets.cpu()).all()
    big = torch.finfo(torch.float32).min
    scores = torch.zeros(2, 3, device="tpu") + torch.full((2, 3), big, device="tpu") + big
    assert torch.isinf(scores.cpu()).all()
    with pytest.raises(TpuNonFiniteError, match="NaN"):  # a NaN from finite inputs still is
        torch.sqrt(_tpu(-1.0, 4.0))


def test_propagated_nan_is_not_blamed(debug):
    x = torch.tensor([float("nan"), 1.0]).to("tpu")  # the NaN comes from the user's data
    y = (x * 2).exp().sum()                           # propagates it: no error
    assert torch.isnan(y.cpu())
    # non-finite scalars are the user's, too
    m = torch.full((2, 2), float("-inf"), device="tpu")
    mask = _tpu(True, False, dtype=torch.bool)
    s = torch.zeros(2, 2, device="tpu").masked_fill(mask, float("-inf"))
    assert torch.isinf(m.cpu()).all() and torch.isinf(s.cpu()).sum() == 2
    torch.softmax(torch.triu(m, 1), -1)  # -inf masking: fine


def test_nan_in_backward_names_the_backward_call(debug):
    x = _tpu(0.0, 4.0).requires_grad_()
    y = torch.where(x > 0, x.sqrt(), 0.0).sum()  # sqrt's backward at 0: 0 / 0
    line = _op_line()
    with pytest.raises(TpuNonFiniteError) as e:
        y.backward()
    assert "backward() called at" in str(e.value) and line in str(e.value)


def test_nan_check_can_be_turned_off(debug, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEBUG_NAN_CHECK", "0")
    assert torch.isnan(torch.log(_tpu(-1.0)).cpu()).all()


def test_strict_does_not_check():
    assert torch.isnan(torch.log(_tpu(-1.0)).cpu()).all()


def test_every_op_waits_for_its_result(debug):
    y = torch.randn(64, 64, device="tpu") @ torch.randn(64, 64, device="tpu")
    assert _storage.record(y.untyped_storage(), y.dtype)[0].is_ready()


def test_counts_checks_and_dispatches_in_metrics(debug):
    before = dict(metrics.counters)
    x = _tpu(1.0, 2.0)
    (x + 1).index_select(0, _tpu(1, dtype=torch.long))
    after = metrics.counters
    for name in ("dispatches.debug", "debug.nan_checks", "debug.bounds_checks"):
        assert after[name] > before.get(name, 0), name
    assert "debug.nan_checks" in metrics.report()


# ---------------------------------------------------------------- bounds
def test_embedding_out_of_range_raises_instead_of_clamping(debug):
    w = torch.randn(5, 3).to("tpu")
    idx = _tpu(1, 7, dtype=torch.long)
    line = _op_line()
    with pytest.raises(TpuIndexError) as e:
        F.embedding(idx, w)
    msg = str(e.value)
    assert "aten::embedding" in msg and "index 7" in msg and "size 5" in msg and line in msg, msg
    assert isinstance(e.value, IndexError)  # like torch's CPU error
    good = F.embedding(_tpu(4, 0, dtype=torch.long), w)
    torch.testing.assert_close(good.cpu(), w.cpu()[[4, 0]])


A = torch.arange(6.0).reshape(2, 3)


def _i(*v):
    return _tpu(*v, dtype=torch.long)


def _ones(*shape):
    return torch.ones(*shape, device="tpu")


# (name, call on a tpu copy of A, the op named in the error, the value named)
BAD = [
    ("index", lambda a: a[:, _i(0, 3)], "aten::index", "index 3"),
    ("index_negative", lambda a: a[_i(-3)], "aten::index", "index -3"),
    ("gather", lambda a: a.gather(1, _i(0, 3).view(2, 1)), "aten::gather", "index 3"),
    ("gather_negative", lambda a: a.gather(1, _i(-1).view(1, 1)), "aten::gather", "index -1"),
    ("index_put", lambda a: a.index_put_((_i(2),), _tpu(1.0)), "aten::index_put", "index 2"),
    ("setitem", lambda a: a.__setitem__(_i(5), 1.0), "aten::index_put", "index 5"),
    ("scatter", lambda a: a.scatter_(1, _i(4).view(1, 1), 1.0), "aten::scatter", "index 4"),
    ("scatter_add", lambda a: a.scatter_add(0, _i(2).view(1, 1), _ones(1, 1)), "aten::scatter_add",
     "index 2"),
    ("index_select", lambda a: a.index_select(0, _i(2)), "aten::index_select", "index 2"),
    ("index_add", lambda a: a.index_add_(0, _i(2), _ones(1, 3)), "aten::index_add", "index 2"),
    ("index_copy", lambda a: a.index_copy(1, _i(3), _ones(2, 1)), "aten::index_copy", "index 3"),
    ("take", lambda a: a.take(_i(6)), "aten::take", "index 6"),
    ("put", lambda a: a.put_(_i(-7), _tpu(1.0)), "aten::put", "index -7"),
    ("cross_entropy", lambda a: F.cross_entropy(a, _i(0, 3)), "aten::nll_loss", "target 3"),
]


@pytest.mark.parametrize("name,call,op,value", BAD, ids=[b[0] for b in BAD])
def test_out_of_range_index_raises(debug, name, call, op, value):
    a = A.to("tpu")
    with pytest.raises(TpuIndexError) as e:
        call(a)
    msg = str(e.value)
    assert op in msg and value in msg and HERE in msg, msg
    # checked before running: an in-place op left its tensor untouched
    assert torch.equal(a.cpu(), A)


# call(a, index) with `index` building an index tensor on a's device
GOOD = [
    lambda a, i: a[:, i(-1, 0)],
    lambda a, i: a[a > 2],
    lambda a, i: a.gather(1, i(2, 0).view(2, 1)),
    lambda a, i: a.index_put((i(-1),), torch.tensor(9.0, device=a.device)),
    lambda a, i: a.scatter(1, i(2).view(1, 1), 7.0),
    lambda a, i: a.index_select(1, i(2, 2)),
    lambda a, i: a.index_fill(1, i(-1), 0.0),
    lambda a, i: a.take(i(-6, 5)),
    lambda a, i: F.cross_entropy(a, i(0, -100)),
]


@pytest.mark.parametrize("call", GOOD)
def test_in_range_indices_match_cpu(debug, call):
    got = call(A.to("tpu"), _i)
    want = call(A.clone(), lambda *v: torch.tensor(v, dtype=torch.long))
    torch.testing.assert_close(got.cpu(), want)


# ---------------------------------------------------------------- CPU shadow
_LIBS = []


@pytest.fixture(scope="module")
def wrong_op():
    """torch_tpu_debug_test::wrong: x * 2 on CPU, but a (deliberately wrong) lowering of x * 3."""
    lib = torch.library.Library("torch_tpu_debug_test", "DEF")
    lib.define("wrong(Tensor x) -> Tensor")
    lib.impl("wrong", lambda x: x * 2, "CPU")
    op = torch.ops.torch_tpu_debug_test.wrong.default
    registry.lowering(op)(lambda x: x * 3)
    try:
        lib.impl("wrong", _dispatch._kernel(_dispatch.plan_for(op)), "PrivateUse1")
    finally:
        # the plan keeps the lowering; the shared table stays as the package made it
        del registry.LOWERINGS[op]
    _LIBS.append(lib)
    return torch.ops.torch_tpu_debug_test.wrong


def test_cpu_shadow_flags_a_wrong_lowering(debug, wrong_op, monkeypatch):
    x = torch.arange(4.0).to("tpu")
    assert torch.equal(wrong_op(x).cpu(), torch.arange(4.0) * 3)  # unchecked: silently wrong
    monkeypatch.setenv("TORCH_TPU_DEBUG_CPU_CHECK", "1")
    y = torch.sin(x) @ torch.ones(4, 3, device="tpu")  # right lowerings pass
    line = _op_line()
    with pytest.raises(TpuCpuMismatchError) as e:
        wrong_op(x)
    msg = str(e.value)
    assert "torch_tpu_debug_test::wrong" in msg and line in msg and "tpu 3.0 vs cpu 2.0" in msg, msg
    torch.testing.assert_close((y * 2).cpu(), (torch.sin(torch.arange(4.0)) @ torch.ones(4, 3)) * 2)


# ---------------------------------------------------------------- a training loop
def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


@pytest.mark.slow
def test_mlp_training_in_debug_with_cpu_shadow_matches_cpu(debug, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEBUG_CPU_CHECK", "1")
    torch.manual_seed(0)
    model = _mlp()
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
            for _ in range(3)]

    def run(m, device):
        m = m.to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        out = []
        for x, y in data:
            loss = F.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    with torch_tpu.eager_mode(torch_tpu.EagerMode.STRICT):
        want = run(copy.deepcopy(model), "cpu")
    checks = metrics.counters["debug.cpu_checks"]
    got = run(model, "tpu")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    assert metrics.counters["debug.cpu_checks"] > checks
