"""Device-side asserts, as CUDA has them (op/asserts.py): an indexing op given an index out
of range raises at the next synchronization in Strict and DeferAndFuse, naming the op and the
user's line; the process goes on; valid (and negative in-range) indices give CPU's results;
ignore_index is let through; TORCH_TPU_DEVICE_ASSERTS=0 turns it off; Debug raises at the
call.

The error cases run as one user script per mode in a fresh process (`_SCRIPT` below):
each case issues one bad op on a line marked `# issue`, then syncs in one of the
ways user code does (item(), .cpu(), .tolist(), print, torch.tpu.synchronize()), and the
script reports where it raised and what the message said.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

_SCRIPT = r'''
import json, sys
import torch
import torch.nn.functional as F
import torch_tpu

torch_tpu.set_eager_mode(sys.argv[1])
dev = "tpu"
T = lambda *a, **k: torch.tensor(*a, device=dev, **k)

def index():
    x = torch.arange(5., device=dev)
    return x[T([7, 1])]  # issue

def index_put():
    x = torch.zeros(5, device=dev)
    x[T([9])] = 1.0  # issue
    return x

def index_put_accumulate():
    x = torch.zeros(5, device=dev)
    x.index_put_((T([-6]),), T([1.0]), accumulate=True)  # issue
    return x

def gather():
    m = torch.ones(2, 3, device=dev)
    return torch.gather(m, 1, T([[0, 5]]))  # issue

def scatter():
    return torch.zeros(2, 3, device=dev).scatter(1, T([[3]]), 1.0)  # issue

def scatter_add():
    return torch.zeros(5, device=dev).scatter_add(0, T([5]), torch.ones(1, device=dev))  # issue

def scatter_reduce():
    return torch.zeros(5, device=dev).scatter_reduce(0, T([-1]), torch.ones(1, device=dev), "amax")  # issue

def index_select():
    return torch.index_select(torch.ones(5, 2, device=dev), 0, T([0, 5]))  # issue

def index_add():
    return torch.zeros(5, device=dev).index_add(0, T([-1]), torch.ones(1, device=dev))  # issue

def index_copy():
    return torch.zeros(5, device=dev).index_copy_(0, T([8]), torch.ones(1, device=dev))  # issue

def index_fill():
    return torch.zeros(5, device=dev).index_fill(0, T([5]), 2.0)  # issue

def take():
    return torch.take(torch.ones(2, 3, device=dev), T([6]))  # issue

def put():
    return torch.zeros(2, 3, device=dev).put_(T([-7]), T([1.0]))  # issue

def embedding():
    w = torch.randn(5, 3, device=dev)
    return F.embedding(T([[1, 12]]), w)  # issue

def embedding_backward():
    g = torch.ones(2, 3, device=dev)
    return torch.ops.aten.embedding_dense_backward(g, T([1, 5]), 5, -1, False)  # issue

def embedding_bag():
    w = torch.randn(5, 3, device=dev)
    return F.embedding_bag(T([0, 9, 1]), w, T([0, 2]))  # issue

def nll_loss():
    logp = torch.log_softmax(torch.randn(2, 3, device=dev), 1)
    return F.nll_loss(logp, T([0, 3]))  # issue

def nll_loss2d():
    logp = torch.log_softmax(torch.randn(1, 3, 2, 2, device=dev), 1)
    return F.nll_loss(logp, T([[[0, 1], [4, 2]]]))  # issue

def cross_entropy():
    return F.cross_entropy(torch.randn(2, 3, device=dev), T([0, -1]))  # issue

def multi_margin_loss():
    return F.multi_margin_loss(torch.randn(2, 3, device=dev), T([0, 3]))  # issue

def assert_async():  # torchtitan's RoPE checks its position ids so, every forward
    pos = torch.arange(5, device=dev)
    torch._assert_async((pos < 3).all(), "position ids must be < 3")  # issue
    return pos

SYNCS = {
    "item": lambda y: y.sum().item(),
    "cpu": lambda y: y.cpu(),
    "tolist": lambda y: y.tolist(),
    "print": lambda y: print(y),
    "synchronize": lambda y: torch.tpu.synchronize(),
}
CASES = [index, index_put, index_put_accumulate, gather, scatter, scatter_add, scatter_reduce,
         index_select, index_add, index_copy, index_fill, take, put, embedding,
         embedding_backward, embedding_bag, nll_loss, nll_loss2d, cross_entropy,
         multi_margin_loss, assert_async]
out = {}
for i, case in enumerate(CASES):
    sync = list(SYNCS)[i % len(SYNCS)]
    r = {"sync": sync, "raised": None}
    try:
        y = case()
        y = y[0] if isinstance(y, tuple) else y
    except Exception as e:
        r.update(raised="call", type=type(e).__name__, msg=str(e))
    else:
        try:
            SYNCS[sync](y)
        except Exception as e:
            r.update(raised="sync", type=type(e).__name__, msg=str(e),
                     runtime_error=isinstance(e, RuntimeError))
    # the process goes on: a valid index right after gives the right values
    r["after"] = torch.arange(5., device=dev)[T([1, -1])].tolist()
    out[case.__name__] = r
torch.tpu.synchronize()  # nothing left over
print("RESULT " + json.dumps(out))
'''


def _issue_lines(path):
    """case function name -> the line number of its `# issue` line in the script."""
    lines, current = {}, None
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if text.startswith("def "):
            current = text[4:text.index("(")]
        elif text.rstrip().endswith("# issue"):
            lines[current] = n
    return lines


# case -> the aten op the message names (what the user's call became)
_OPS = {
    "index": "aten.index.Tensor", "index_put": "aten.index_put_.default",
    "index_put_accumulate": "aten.index_put_.default", "gather": "aten.gather.default",
    "scatter": "aten.scatter.value", "scatter_add": "aten.scatter_add.default",
    "scatter_reduce": "aten.scatter_reduce.two", "index_select": "aten.index_select.default",
    "index_add": "aten.index_add.default", "index_copy": "aten.index_copy_.default",
    "index_fill": "aten.index_fill.int_Scalar", "take": "aten.take.default",
    "put": "aten.put_.default", "embedding": "aten.embedding.default",
    "embedding_backward": "aten.embedding_dense_backward.default",
    "embedding_bag": "aten._embedding_bag", "nll_loss": "aten.nll_loss_forward.default",
    "nll_loss2d": "aten.nll_loss2d_forward.default",
    "cross_entropy": "aten.nll_loss_forward.default",
    "multi_margin_loss": "aten.multi_margin_loss.default",
    "assert_async": 'aten._assert_async.msg issued',
}


def _run(tmp_path, mode, env=None):
    path = tmp_path / "train.py"
    path.write_text(_SCRIPT)
    proc = subprocess.run([sys.executable, str(path), mode], capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})}, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[-1][len("RESULT "):]), _issue_lines(path), path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_bad_index_raises_at_the_next_sync_naming_op_and_line(tmp_path, mode):
    results, lines, path = _run(tmp_path, mode)
    assert set(results) == set(_OPS)
    for case, r in results.items():
        where = f"{case} (synced by {r['sync']})"
        assert r["raised"] == "sync", f"{where}: {r}"
        assert r["type"] == "DeviceAssertError" and r["runtime_error"], where
        msg = r["msg"]
        assert "device-side assert triggered" in msg, where
        assert _OPS[case] in msg, f"{where}: {msg}"
        assert f"issued at {path}:{lines[case]}" in msg, f"{where}: {msg}"
        assert r["after"] == [1.0, 4.0], where  # the process went on


@pytest.mark.slow
def test_debug_raises_at_the_call(tmp_path):
    results, _, _ = _run(tmp_path, "debug")
    for case, r in results.items():
        assert r["raised"] == "call" and r["type"] == "TpuIndexError", f"{case}: {r}"
        assert r["after"] == [1.0, 4.0], case


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_switched_off_nothing_raises(tmp_path, mode):
    results, _, _ = _run(tmp_path, mode, {"TORCH_TPU_DEVICE_ASSERTS": "0"})
    for case, r in results.items():
        assert r["raised"] is None, f"{case}: {r}"


# ---------------------------------------------------------------- valid indices: CPU's values
def _ops(dev):
    T = lambda *a, **k: torch.tensor(*a, device=dev, **k)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 5, generator=g).to(dev)
    logits = torch.randn(3, 5, generator=g).to(dev)
    w = torch.randn(6, 3, generator=g).to(dev)
    return {
        "index": lambda: base[T([3, -4, 0]), T([-1, 2, 4])],
        "index_mask_and_int": lambda: base[T([True, False, True, True]), T([0, -1, 2])],
        "index_put": lambda: base.clone().index_put_((T([-1, 0]),), T([7.0])),
        "index_put_acc": lambda: base.clone().index_put_((T([1, 1]), T([-5, 4])), T([1.0, 2.0]),
                                                         accumulate=True),
        "gather": lambda: torch.gather(base, 1, T([[0, 4], [1, 1], [2, 3], [4, 0]])),
        "scatter": lambda: torch.zeros(4, 5, device=dev).scatter(0, T([[3, 0, 1, 2, 0]]), base),
        "scatter_add": lambda: torch.zeros(5, device=dev).scatter_add(0, T([4, 4, 0]), base[0, :3]),
        "index_select": lambda: torch.index_select(base, 1, T([4, 0, 0])),
        "index_add": lambda: torch.zeros(4, 5, device=dev).index_add(0, T([3, 0]), base[:2]),
        "index_fill": lambda: base.clone().index_fill(1, T([-1, 0]), 2.5),
        "take": lambda: torch.take(base, T([[-1, 0], [19, 7]])),
        "put": lambda: base.clone().put_(T([-20, 3]), T([1.0, 2.0])),
        "embedding": lambda: F.embedding(T([[0, 5], [2, 2]]), w),
        "embedding_bag": lambda: F.embedding_bag(T([0, 5, 2, 1]), w, T([0, 3]), mode="mean"),
        "cross_entropy": lambda: F.cross_entropy(logits, T([4, 0, 2])),
        "cross_entropy_ignore": lambda: F.cross_entropy(logits, T([4, -100, 2])),
        "nll_ignore_out_of_range_value": lambda: F.nll_loss(torch.log_softmax(logits, 1),
                                                            T([7, 1, 7]), ignore_index=7),
        "multi_margin_loss": lambda: F.multi_margin_loss(logits, T([4, 0, 2])),
        # a true assertion passes, and the values after it are CPU's
        "assert_async": lambda: (torch._assert_async((base.abs() >= 0).all(), "finite"),
                                 torch._assert_async(T(1)), base * 2)[-1],
    }


@pytest.mark.parametrize("name", list(_ops("cpu")))
def test_valid_indices_match_cpu_and_raise_nothing(eager, name):
    want = _ops("cpu")[name]()
    got = _ops("tpu")[name]()
    torch.testing.assert_close(got.cpu(), want)
    torch.tpu.synchronize()  # every pending code read: none may be set


def test_embedding_backward_with_padding_matches_cpu(eager):
    def run(dev):
        w = torch.randn(6, 3, generator=torch.Generator().manual_seed(1)).to(dev).requires_grad_()
        F.embedding(torch.tensor([[0, 5, 2], [2, 2, 1]], device=dev), w, padding_idx=2).sum().backward()
        return w.grad
    torch.testing.assert_close(run("tpu").cpu(), run("cpu"))
    torch.tpu.synchronize()


def test_error_then_training_goes_on(eager):
    """A bad batch in a training loop raises at its loss.item(); the next steps train as on CPU."""
    def steps(dev, bad_at):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(8, 3)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses, errors = [], 0
        for step in range(4):
            ids = torch.tensor([[1, 2], [3, 12 if step == bad_at else 4]], device=dev)
            loss = F.cross_entropy(model(ids), torch.tensor([0, 2], device=dev))
            if step == bad_at:
                try:
                    loss.item()
                except RuntimeError as e:
                    assert "device-side assert triggered" in str(e)
                    errors += 1
                continue
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, errors
    got, errors = steps("tpu", bad_at=1)
    want, _ = steps("cpu", bad_at=-1)
    assert errors == 1
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want[:3]), rtol=1e-5, atol=1e-6)


def test_many_checked_ops_without_a_sync_stay_bounded():
    from torch_tpu.op import asserts

    x = torch.arange(8.0, device="tpu")
    idx = torch.tensor([1, 2], device="tpu")
    for _ in range(600):
        x = x.index_select(0, torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], device="tpu"))
        x[idx] = x[idx] + 1
    assert len(asserts._pending) <= asserts._MAX_PENDING
    assert x[1].item() == 601.0


def test_codes_combined_on_device_one_value_read_per_sync():
    """The codes of many checked ops are combined on the device, inside their own programs:
    a sync copies one value to the host, however many ops there were."""
    from torch_tpu import metrics

    x = torch.arange(8.0, device="tpu")
    torch.tpu.synchronize()
    before = metrics.counters.copy()
    for _ in range(5):
        x = x[torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], device="tpu")]
    x.cpu()
    grew = metrics.counters - before
    assert grew["device_asserts.issued"] == 5
    assert grew["device_asserts.reads"] == 1 and grew["device_asserts.values_read"] == 1


def test_the_first_bad_op_is_named_and_the_state_resets(eager):
    import inspect

    x = torch.arange(6.0, device="tpu")
    ok = torch.tensor([0, 5], device="tpu")
    y = x[ok] + x[ok]
    line = inspect.currentframe().f_lineno + 1
    torch.gather(x, 0, torch.tensor([6], device="tpu"))  # the first bad op
    x[torch.tensor([9], device="tpu")]  # a later one, in the same chain
    y = y + x[ok]
    with pytest.raises(torch_tpu.DeviceAssertError,
                       match=rf"aten\.gather\.default issued at .*test_device_asserts\.py:{line}"):
        y.cpu()
    torch.tpu.synchronize()  # reported once: the chain that held it is gone
    torch.testing.assert_close(y.cpu(), torch.tensor([0.0, 15.0]))
