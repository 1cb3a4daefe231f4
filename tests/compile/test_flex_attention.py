"""FlexAttention on tpu (`torch.nn.attention.flex_attention`), eager and compiled, forward
and backward, against the same attention written as plain math on CPU with autograd (CPU's
own flex_attention refuses backward): a causal `score_mod` with a learnable per-head bias
(its gradient too), a `block_mask` from `create_block_mask`, document masking through a
captured tensor, grouped-query heads, a fully masked row, and the logsumexp."""
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_tpu
from torch_tpu import metrics

B, H, S, D = 2, 4, 64, 16
MODES = ["strict", "defer", "compiled"]


def _inputs(heads_kv=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g)
    k, v = (torch.randn(B, heads_kv, S, D, generator=g) for _ in range(2))
    return q, k, v, torch.randn(H, generator=g) * 0.5


def _reference(q, k, v, bias, allowed, groups=1):
    """Plain attention: scores + bias[h] * (q_idx - kv_idx) / S where allowed."""
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) / D ** 0.5
    qi, ki = torch.arange(S)[:, None], torch.arange(S)[None, :]
    s = s + bias[None, :, None, None] * (qi - ki) / S
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(s.softmax(-1))  # a fully masked row: zeros, as flex_attention
    return p @ v, lse


def _run(mode, q, k, v, bias, mask_mod, doc=None, gqa=False):
    """flex_attention on tpu in `mode`: (out, lse, grads of q, k, v, bias) on the host."""
    dev = [x.to("tpu").requires_grad_() for x in (q, k, v, bias)]
    tq, tk, tv, tbias = dev
    doc_t = doc.to("tpu") if doc is not None else None

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + tbias[h] * (q_idx - kv_idx) / S

    def mask(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx, doc_t)

    block_mask = create_block_mask(mask, B, H, S, S, device="tpu")

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                              enable_gqa=gqa, return_lse=True)

    fn = torch.compile(attend, backend="tpu") if mode == "compiled" else attend
    ctx = torch_tpu.eager_mode("defer_and_fuse" if mode == "defer" else "strict")
    with ctx:
        out, lse = fn(tq, tk, tv)
        (out.square().sum() + lse.sum()).backward()
        return [t.detach().cpu() for t in (out, lse)] + [t.grad.cpu() for t in dev]


def _check(got, q, k, v, bias, allowed, groups=1):
    ref = [x.clone().requires_grad_() for x in (q, k, v, bias)]
    out, lse = _reference(*ref, allowed, groups)
    finite = torch.isfinite(lse)
    (out.square().sum() + lse[finite].sum()).backward()
    torch.testing.assert_close(got[0], out.detach(), rtol=1e-4, atol=1e-5)
    assert torch.equal(torch.isfinite(got[1]), finite)
    torch.testing.assert_close(got[1][finite], lse.detach()[finite], rtol=1e-4, atol=1e-5)
    for g, r in zip(got[2:], ref):
        torch.testing.assert_close(g, r.grad, rtol=1e-3, atol=1e-4)


def _causal(b, h, q_idx, kv_idx, doc):
    return q_idx >= kv_idx


@pytest.mark.parametrize("mode", MODES)
def test_causal_score_mod_and_block_mask(mode):
    q, k, v, bias = _inputs()
    got = _run(mode, q, k, v, bias, _causal)
    _check(got, q, k, v, bias, torch.tril(torch.ones(S, S, dtype=torch.bool)))


def _documents(b, h, q_idx, kv_idx, doc):
    return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx) & (q_idx != 5)


@pytest.mark.parametrize("mode", MODES)
def test_document_masking_with_an_empty_row(mode):
    q, k, v, bias = _inputs(seed=1)
    doc = torch.tensor([0] * 20 + [1] * 30 + [2] * 14)
    allowed = (doc[:, None] == doc[None, :]) & torch.tril(torch.ones(S, S, dtype=torch.bool))
    allowed[5] = False  # row 5 sees nothing: output 0, logsumexp -inf, no gradient
    got = _run(mode, q, k, v, bias, _documents, doc=doc)
    _check(got, q, k, v, bias, allowed)


@pytest.mark.parametrize("mode", ["strict", "compiled"])
def test_grouped_query_heads(mode):
    q, k, v, bias = _inputs(heads_kv=2, seed=2)
    got = _run(mode, q, k, v, bias, _causal, gqa=True)
    _check(got, q, k, v, bias, torch.tril(torch.ones(S, S, dtype=torch.bool)), groups=2)


def test_compiled_flex_attention_is_one_program_per_graph():
    q, k, v, bias = _inputs(seed=3)
    before = metrics.counters.copy()
    torch._dynamo.reset()
    _run("compiled", q, k, v, bias, _causal)
    grew = metrics.counters - before
    assert grew["compile.graphs"] == 2 and not grew["compile.eager_graphs"], dict(grew)


def test_other_devices_keep_torchs_check():
    q = torch.randn(1, 1, 8, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q)
