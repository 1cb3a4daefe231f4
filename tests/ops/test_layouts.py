"""Memory layouts of op results on tpu against CPU, in Strict, Debug and DeferAndFuse.

Like CPU and CUDA, a result keeps its input's layout where torch's kernels do
(TensorIterator's elementwise ops, softmax, layer_norm, SDPA, clone and empty_like with
preserve_format): `x.transpose(1, 2) * 2` is itself transposed in memory, so transposing
it back gives a contiguous tensor that `.view` accepts. The chains here are the ones user
code writes (HF Llama's attention: `view().transpose(1, 2)`, rotary, SDPA,
`.transpose(1, 2).reshape`), and every check compares with the same code run on CPU."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import metrics

B, S, H, D = 2, 5, 3, 4


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def mode(request):
    before = metrics.counters.copy()
    with torch_tpu.eager_mode(request.param):
        yield request.param
    if request.param == "defer_and_fuse":  # the ops were recorded, not run one by one
        grew = metrics.counters - before  # (empty_like runs no op: its input's upload, with
        # nothing pending, goes at once)
        assert not grew["dispatches.strict"], dict(grew)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _both(fn, *inputs):
    """fn on CPU inputs and on their tpu copies -> (cpu result, tpu result)."""
    return fn(*inputs), fn(*[t.to("tpu") for t in inputs])


def _same_layout(cpu, tpu):
    assert tpu.device.type == "tpu"
    assert tpu.shape == cpu.shape
    assert tpu.stride() == cpu.stride(), (tpu.stride(), cpu.stride())
    assert tpu.is_contiguous() == cpu.is_contiguous()


def test_transposed_elementwise_then_view(mode):
    def chain(x):
        y = (x.transpose(1, 2) * 2).transpose(1, 2)
        return y, y.view(B, S, -1)

    (cy, cv), (ty, tv) = _both(chain, _randn(B, S, H, D))
    _same_layout(cy, ty)
    assert ty.is_contiguous()
    torch.testing.assert_close(tv.cpu(), cv)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _llama_attention(h, wq, wk, wv, cos, sin):
    """HF Llama's attention core: projections viewed per head and transposed, rotary
    embedding, SDPA, transposed back and viewed as (B, S, H * D)."""
    q = (h @ wq).view(B, S, H, D).transpose(1, 2)
    k = (h @ wk).view(B, S, H, D).transpose(1, 2)
    v = (h @ wv).view(B, S, H, D).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out, out.transpose(1, 2).view(B, S, -1)


def _llama_inputs():
    pos = torch.arange(S, dtype=torch.float32)[:, None] * torch.arange(D, dtype=torch.float32)
    return (_randn(B, S, H * D, seed=1), _randn(H * D, H * D, seed=2) / 4,
            _randn(H * D, H * D, seed=3) / 4, _randn(H * D, H * D, seed=4) / 4,
            pos.cos(), pos.sin())


def test_sdpa_on_transposed_heads_views_back(mode):
    (c_out, c_view), (t_out, t_view) = _both(_llama_attention, *_llama_inputs())
    _same_layout(c_out, t_out)
    assert not t_out.is_contiguous()  # (B, H, S, D) in (B, S, H, D) memory, as on CPU
    torch.testing.assert_close(t_view.cpu(), c_view, rtol=1e-4, atol=1e-5)


def test_llama_attention_backward_matches_cpu(mode):
    inputs = _llama_inputs()
    grads = []
    for device in ("cpu", "tpu"):
        leaves = [t.detach().to(device).requires_grad_(i < 4) for i, t in enumerate(inputs)]
        _, view = _llama_attention(*leaves)
        (view * view.detach().sin()).sum().backward()
        grads.append([t.grad.cpu() for t in leaves[:4]])
    for c, t in zip(*grads):
        torch.testing.assert_close(t, c, rtol=1e-4, atol=1e-5)


def test_contiguous_of_a_permutation_is_contiguous(mode):
    x = _randn(B, S, H, D)
    c, t = _both(lambda x: x.permute(0, 2, 1, 3).contiguous(), x)
    _same_layout(c, t)
    assert t.is_contiguous() and t.stride() == (H * S * D, S * D, D, 1)
    torch.testing.assert_close(t.cpu(), c)
    # and an op on it is contiguous too
    c2, t2 = _both(lambda x: x.permute(0, 2, 1, 3).contiguous().exp(), x)
    _same_layout(c2, t2)


# op -> a function of (permuted input, another permuted input)
_OPS = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * 3,
    "exp": lambda x, y: x.exp(),
    "where": lambda x, y: torch.where(x > 0, x, y),
    "softmax": lambda x, y: x.softmax(-1),
    "layer_norm": lambda x, y: F.layer_norm(x, (x.shape[-1],)),
    "sdpa": lambda x, y: F.scaled_dot_product_attention(x, y, y),
    "clone": lambda x, y: x.clone(memory_format=torch.preserve_format),
    "empty_like": lambda x, y: torch.empty_like(x),
}
# input layouts: a transposed (B, H, S, D) view of (B, S, H, D) memory, and channels_last
_LAYOUTS = {
    "transposed": lambda t: t.transpose(1, 2),
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
}


# not (sdpa, channels_last): for a query whose head dim is not innermost CPU's flash kernel
# makes it contiguous first, while tpu (and DTensor) follow the fused op's meta kernel,
# which keeps the query's layout
@pytest.mark.parametrize("op,layout", [(o, la) for o in _OPS for la in _LAYOUTS
                                       if (o, la) != ("sdpa", "channels_last")])
def test_result_layout_matches_cpu(mode, op, layout):
    fn, lay = _OPS[op], _LAYOUTS[layout]

    def run(a, b):
        return fn(lay(a), lay(b))

    c, t = _both(run, _randn(B, S, H, D, seed=5), _randn(B, S, H, D, seed=6))
    _same_layout(c, t)
    if op != "empty_like":
        torch.testing.assert_close(t.cpu(), c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", [o for o in _OPS if o not in ("clone", "empty_like")])
def test_backward_through_permuted_results_matches_cpu(mode, op):
    fn = _OPS[op]
    grads = []
    for device in ("cpu", "tpu"):
        a = _randn(B, S, H, D, seed=7).to(device).requires_grad_()
        b = _randn(B, S, H, D, seed=8).to(device).requires_grad_()
        y = fn(a.transpose(1, 2), b.transpose(1, 2)).transpose(1, 2)
        (y.reshape(B, S, -1) * torch.linspace(-1, 1, H * D, device=device)).sum().backward()
        grads.append((a.grad.cpu(), None if b.grad is None else b.grad.cpu()))
    (ca, cb), (ta, tb) = grads
    torch.testing.assert_close(ta, ca, rtol=1e-4, atol=1e-5)
    assert (tb is None) == (cb is None)
    if cb is not None:
        torch.testing.assert_close(tb, cb, rtol=1e-4, atol=1e-5)


def test_expanded_result_stays_dense(mode):
    """An op whose meta result would not be a dense permutation still gives a usable,
    dense tensor (expand + op: TensorIterator gives a dense result on CPU too)."""
    x = _randn(1, H, 1, D)
    c, t = _both(lambda x: x.expand(B, H, S, D) + 1, x)
    _same_layout(c, t)
    torch.testing.assert_close(t.cpu(), c)


def test_in_place_writes_into_a_permuted_result(mode):
    """In-place ops and slice assignment into a result kept in its input's layout."""
    def chain(x):
        y = x.transpose(1, 2) * 2
        y.add_(1)
        y[:, 0] = 0
        y[..., 1:3].mul_(-1)
        return y

    c, t = _both(chain, _randn(B, S, H, D, seed=9))
    _same_layout(c, t)
    torch.testing.assert_close(t.cpu(), c)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_views_at_offsets_read_and_write_as_on_cpu(mode):
    """Offsets passed as data (_storage.offset_is_data): reads and writes of slices,
    strided and gathered views at many offsets match CPU, and one program serves them."""
    from torch_tpu import metrics
    base = torch.arange(96.0).reshape(8, 12)
    with torch_tpu.eager_mode(mode):
        x = base.to("tpu")
        for k in range(3):
            got = (x[k:k + 4] * 2, x[k:k + 3, 1::3] + 1, x.t()[k + 1:k + 5].sum(1),
                   x.view(-1)[k:k + 20].view(4, 5).t() * 1)
            want = (base[k:k + 4] * 2, base[k:k + 3, 1::3] + 1, base.t()[k + 1:k + 5].sum(1),
                    base.view(-1)[k:k + 20].view(4, 5).t() * 1)
            for g, w in zip(got, want):
                torch.testing.assert_close(g.cpu(), w)
            if k == 0:
                before = metrics.as_dict()["counters"].get("op_entries", 0)
        assert metrics.as_dict()["counters"].get("op_entries", 0) == before
        y, ref = torch.zeros(6, 5, device="tpu"), torch.zeros(6, 5)
        for k in range(4):
            y[k:k + 2].add_(k + 1.0)
            ref[k:k + 2].add_(k + 1.0)
            y[:, k::2].mul_(2.0)
            ref[:, k::2].mul_(2.0)
        torch.testing.assert_close(y.cpu(), ref)
