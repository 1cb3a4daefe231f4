"""nn, normalization, loss, convolution, pooling and upsampling ops on tpu against CPU:
forward values and autograd gradients, plus a small CNN and an MLP trained on both; each in
Strict and in DeferAndFuse (the `eager` fixture)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from helpers.mode_matrix import parametrize

aten = torch.ops.aten


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=_gen(seed))


def randint(high, shape, seed=0):
    return torch.randint(0, high, shape, generator=_gen(seed))


def probs(*shape, seed=0):
    return torch.rand(*shape, generator=_gen(seed)) * 0.9 + 0.05


class Case:
    """fn(*inputs) on tpu against CPU. Float inputs listed in `diff` (default: all float
    inputs) get gradients, checked through autograd with a random cotangent."""

    def __init__(self, name, fn, *inputs, diff=None, bf16=False):
        self.name, self.fn, self.inputs, self.diff, self.bf16 = name, fn, inputs, diff, bf16


CASES = [
    # softmax
    Case("softmax", lambda x: F.softmax(x, 1), randn(4, 7), bf16=True),
    Case("log_softmax", lambda x: F.log_softmax(x, -1), randn(2, 3, 5), bf16=True),
    Case("softmax_dim0", lambda x: F.softmax(x, 0), randn(3, 4)),
    Case("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         randn(1, 2, 4, 8, seed=1), randn(1, 2, 4, 8, seed=2), randn(1, 2, 4, 8, seed=3),
         bf16=True),
    Case("sdpa_causal_more_keys",
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
         randn(2, 2, 4, 8, seed=1), randn(2, 2, 6, 8, seed=2), randn(2, 2, 6, 8, seed=3)),
    Case("sdpa_gqa", lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True),
         randn(2, 4, 5, 8, seed=1), randn(2, 2, 5, 8, seed=2), randn(2, 2, 5, 8, seed=3)),
    Case("sdpa_bool_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
         randn(2, 2, 4, 8, seed=1), randn(2, 2, 6, 8, seed=2), randn(2, 2, 6, 8, seed=3),
         torch.rand(4, 6, generator=_gen(4)) > 0.3),
    Case("sdpa_float_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
         randn(2, 2, 4, 8, seed=1), randn(2, 2, 6, 8, seed=2), randn(2, 2, 6, 8, seed=3),
         randn(2, 1, 4, 6, seed=4)),
    Case("sdpa_3d", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
         randn(3, 4, 8, seed=1), randn(3, 5, 8, seed=2), randn(3, 5, 6, seed=3)),
    # normalization
    Case("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b),
         randn(3, 4, 5), randn(5, seed=1), randn(5, seed=2), bf16=True),
    Case("layer_norm_2d_no_affine", lambda x: F.layer_norm(x, (3, 5)), randn(2, 3, 5)),
    Case("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b),
         randn(2, 4, 3, 3), randn(4, seed=1), randn(4, seed=2), bf16=True),
    Case("group_norm_no_affine", lambda x: F.group_norm(x, 3, eps=1e-3), randn(2, 6, 5)),
    Case("batch_norm_train_no_stats",
         lambda x, w, b: aten._native_batch_norm_legit(x, w, b, True, 0.1, 1e-5)[0],
         randn(4, 3, 2, 2), randn(3, seed=1), randn(3, seed=2)),
    Case("batch_norm_eval",
         lambda x, w, b, m, v: aten._native_batch_norm_legit_no_training(x, w, b, m, v, 0.1,
                                                                         1e-5)[0],
         randn(4, 3, 5), randn(3, seed=1), randn(3, seed=2), randn(3, seed=3), probs(3),
         diff=(0, 1, 2)),
    # losses
    Case("cross_entropy", lambda x, t: F.cross_entropy(x, t), randn(5, 7), randint(7, (5,)),
         bf16=True),
    Case("cross_entropy_weight_ignore",
         lambda x, t, w: F.cross_entropy(x, t, w, ignore_index=2),
         randn(6, 4), randint(4, (6,)), probs(4), diff=(0,)),
    Case("cross_entropy_2d_sum", lambda x, t: F.cross_entropy(x, t, reduction="sum"),
         randn(2, 3, 4, 4), randint(3, (2, 4, 4))),
    Case("nll_loss_none_weight", lambda x, t, w: F.nll_loss(x, t, w, reduction="none"),
         randn(5, 4), randint(4, (5,)), probs(4), diff=(0,)),
    Case("nll_loss_unbatched", lambda x, t: F.nll_loss(x, t), randn(6), torch.tensor(3)),
    Case("mse_loss", lambda x, y: F.mse_loss(x, y), randn(3, 5), randn(3, 5, seed=1)),
    Case("mse_loss_none", lambda x, y: F.mse_loss(x, y, reduction="none"), randn(4),
         randn(4, seed=1)),
    Case("smooth_l1_loss", lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), randn(3, 5),
         randn(3, 5, seed=1)),
    Case("huber_loss_sum", lambda x, y: F.huber_loss(x, y, reduction="sum", delta=0.7),
         randn(3, 5), randn(3, 5, seed=1)),
    Case("l1_loss", lambda x, y: F.l1_loss(x, y), randn(3, 5), randn(3, 5, seed=1)),
    Case("binary_cross_entropy", lambda x, y, w: F.binary_cross_entropy(x, y, w),
         probs(3, 5), probs(3, 5, seed=1), probs(5, seed=2), diff=(0,)),
    Case("bce_with_logits", lambda x, y, w, pw: F.binary_cross_entropy_with_logits(
        x, y, w, pos_weight=pw), randn(3, 5), probs(3, 5, seed=1), probs(5, seed=2),
        probs(5, seed=3), diff=(0,)),
    # embedding, glu
    Case("embedding_padding_idx", lambda w, i: F.embedding(i, w, padding_idx=1),
         randn(6, 3), torch.tensor([[0, 1, 5], [2, 2, 1]]), bf16=True),
    Case("embedding_scale_grad_by_freq", lambda w, i: F.embedding(i, w, scale_grad_by_freq=True),
         randn(5, 4), torch.tensor([0, 3, 3, 4, 3])),
    Case("glu", lambda x: F.glu(x, 1), randn(3, 6)),
    # convolution
    Case("conv1d_stride_groups", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, groups=2),
         randn(2, 4, 9), randn(6, 2, 3, seed=1), randn(6, seed=2)),
    Case("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=(1, 2), padding=(1, 0),
                                            dilation=(2, 1)),
         randn(2, 3, 7, 8), randn(4, 3, 3, 2, seed=1), randn(4, seed=2), bf16=True),
    Case("conv2d_depthwise_no_bias", lambda x, w: F.conv2d(x, w, padding="same", groups=4),
         randn(1, 4, 5, 5), randn(4, 1, 3, 3, seed=1)),
    Case("conv3d", lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1),
         randn(1, 2, 4, 5, 5), randn(3, 2, 2, 3, 3, seed=1)),
    Case("conv_transpose1d", lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=2,
                                                             output_padding=2),
         randn(2, 4, 7), randn(4, 3, 3, seed=1)),
    Case("conv_transpose2d_groups", lambda x, w, b: F.conv_transpose2d(
        x, w, b, stride=(2, 1), padding=(0, 1), output_padding=(1, 0), groups=2,
        dilation=(2, 1)),
        randn(2, 4, 5, 6), randn(4, 2, 3, 2, seed=1), randn(4, seed=2), bf16=True),
    # pooling
    Case("max_pool2d_ceil", lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), randn(2, 3, 7, 8),
         bf16=True),
    Case("max_pool2d_dilation", lambda x: F.max_pool2d(x, (3, 2), (2, 1), (1, 0), dilation=(2, 1)),
         randn(1, 2, 9, 6)),
    Case("max_pool1d", lambda x: F.max_pool1d(x, 2), randn(2, 3, 9)),
    Case("max_pool3d", lambda x: F.max_pool3d(x, (2, 3, 2), (2, 2, 1), (1, 1, 0), ceil_mode=True),
         randn(1, 2, 5, 6, 5)),
    Case("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1), randn(2, 3, 7, 8), bf16=True),
    Case("avg_pool2d_exclude_pad_ceil",
         lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
         randn(2, 3, 7, 8)),
    Case("avg_pool2d_divisor", lambda x: F.avg_pool2d(x, (3, 2), 2, 1, divisor_override=5),
         randn(1, 2, 6, 6)),
    Case("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2), randn(2, 3, 9)),
    Case("avg_pool3d", lambda x: F.avg_pool3d(x, 2, (2, 2, 1), 1, ceil_mode=True),
         randn(1, 2, 5, 6, 5)),
    Case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 5)), randn(2, 3, 7, 8)),
    Case("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)),
         randn(1, 2, 5, 6, 5)),
    Case("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (3, 5)), randn(2, 3, 7, 8)),
    Case("max_unpool2d", lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
         randn(1, 2, 4, 6)),
    Case("unfold", lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
         randn(2, 3, 5, 6)),
    Case("fold", lambda x: F.fold(x, (4, 5), (2, 2), padding=1), randn(2, 12, 30)),
    # upsampling
    Case("interpolate_nearest_x2", lambda x: F.interpolate(x, scale_factor=2), randn(1, 2, 3, 4)),
    Case("interpolate_nearest_size", lambda x: F.interpolate(x, size=(7, 3)), randn(1, 2, 5, 6)),
    Case("interpolate_nearest_exact", lambda x: F.interpolate(x, scale_factor=1.7,
                                                              mode="nearest-exact"),
         randn(1, 2, 5, 6)),
    Case("interpolate_bilinear", lambda x: F.interpolate(x, size=(7, 13), mode="bilinear"),
         randn(2, 3, 5, 6), bf16=True),
    Case("interpolate_bilinear_align_corners",
         lambda x: F.interpolate(x, scale_factor=(1.5, 0.6), mode="bilinear", align_corners=True),
         randn(2, 3, 5, 6)),
    Case("interpolate_bicubic", lambda x: F.interpolate(x, size=(7, 4), mode="bicubic"),
         randn(1, 2, 5, 6)),
    Case("interpolate_linear", lambda x: F.interpolate(x, scale_factor=2.5, mode="linear"),
         randn(2, 3, 7)),
    Case("interpolate_bilinear_antialias",
         lambda x: F.interpolate(x, size=(4, 9), mode="bilinear", antialias=True),
         randn(2, 3, 10, 6)),
    Case("interpolate_bicubic_antialias_align_corners",
         lambda x: F.interpolate(x, scale_factor=(0.4, 1.5), mode="bicubic", antialias=True,
                                 align_corners=True),
         randn(1, 2, 9, 5)),
    # grid sampling
    Case("grid_sample_bilinear_zeros", lambda x, g: F.grid_sample(x, g, align_corners=False),
         randn(2, 3, 5, 6), randn(2, 4, 7, 2, seed=1)),
    Case("grid_sample_bilinear_border_align_corners",
         lambda x, g: F.grid_sample(x, g, padding_mode="border", align_corners=True),
         randn(2, 3, 5, 6), randn(2, 4, 7, 2, seed=1)),
    Case("grid_sample_nearest_reflection",
         lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="reflection",
                                    align_corners=False),
         randn(2, 3, 5, 6), randn(2, 4, 7, 2, seed=1)),
    Case("grid_sample_bicubic_reflection",
         lambda x, g: F.grid_sample(x, g, mode="bicubic", padding_mode="reflection",
                                    align_corners=True),
         randn(1, 2, 5, 6), randn(1, 3, 4, 2, seed=1) * 0.6),
    Case("grid_sample_3d_bilinear_reflection",
         lambda x, g: F.grid_sample(x, g, padding_mode="reflection", align_corners=False),
         randn(2, 2, 3, 4, 5), randn(2, 2, 3, 4, 3, seed=1)),
    Case("channel_shuffle", lambda x: F.channel_shuffle(x, 3), randn(2, 6, 2, 3)),
    # fractional max pooling: fixed samples make the windows deterministic
    Case("fractional_max_pool2d",
         lambda x, u: F.fractional_max_pool2d(x, (3, 2), output_size=(4, 5), _random_samples=u),
         randn(2, 3, 9, 11), probs(2, 3, 2, seed=1), diff=(0,), bf16=True),
    Case("fractional_max_pool3d",
         lambda x, u: F.fractional_max_pool3d(x, 2, output_size=(3, 4, 2), _random_samples=u),
         randn(1, 2, 6, 7, 5), probs(1, 2, 3, seed=1), diff=(0,)),
    # embedding_bag
    Case("embedding_bag_sum_weights",
         lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
         randn(10, 4), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6]),
         probs(8, seed=1), bf16=True),
    Case("embedding_bag_mean_padding_idx",
         lambda w, i: F.embedding_bag(i, w, mode="mean", padding_idx=2),
         randn(6, 3), torch.tensor([[0, 2, 5], [2, 2, 2], [1, 1, 4]])),
    Case("embedding_bag_max_include_last_offset",
         lambda w, i, o: F.embedding_bag(i, w, o, mode="max", include_last_offset=True),
         randn(8, 5), torch.tensor([7, 0, 3, 3, 1, 6]), torch.tensor([0, 2, 2, 5, 6])),
    # margin and CTC losses
    Case("multi_margin_loss_p2_weight",
         lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.7, weight=w),
         randn(5, 4), randint(4, (5,)), probs(4, seed=1), diff=(0,)),
    Case("multi_margin_loss_none", lambda x, t: F.multi_margin_loss(x, t, reduction="none"),
         randn(3, 6), randint(6, (3,))),
    # one unbatched frame (0-dim target): a 0-dim loss even unreduced, as on CPU
    Case("multi_margin_loss_one_frame_none",
         lambda x, t, w: F.multi_margin_loss(x, t, p=2, weight=w, reduction="none"),
         randn(5), torch.tensor(3), probs(5, seed=1), diff=(0,)),
    Case("multi_margin_loss_0dim", lambda x, t: F.multi_margin_loss(x, t, margin=-3.1),
         randn(()), torch.tensor(0)),
    Case("multilabel_margin_loss_one_frame_none",
         lambda x, t: F.multilabel_margin_loss(x, t, reduction="none"),
         randn(5), torch.tensor([3, 0, -1, 1, 2])),
    Case("multilabel_margin_loss",
         lambda x, t: F.multilabel_margin_loss(x, t),
         randn(3, 5), torch.tensor([[3, 0, -1, 1, 2], [4, 4, 1, 2, 3], [-1, 0, 0, 0, 0]])),
    Case("ctc_loss",
         lambda x, t: F.ctc_loss(F.log_softmax(x, -1), t, [12, 9, 10], [4, 0, 3]),
         randn(12, 3, 5), torch.tensor([[1, 2, 2, 4], [1, 1, 1, 1], [3, 1, 3, 0]])),
    Case("ctc_loss_concatenated_targets_sum",
         lambda x, t: F.ctc_loss(F.log_softmax(x, -1), t, [8, 8], [3, 2], blank=4,
                                 reduction="sum"),
         randn(8, 2, 5), torch.tensor([0, 0, 1, 2, 3])),
    # segment reductions
    Case("segment_reduce_max_lengths",
         lambda x, n: torch.segment_reduce(x, "max", lengths=n, unsafe=True),
         randn(7, 3), torch.tensor([2, 0, 4, 1])),
    Case("segment_reduce_mean_initial",
         lambda x, n: torch.segment_reduce(x, "mean", lengths=n, initial=1.5),
         randn(6, 2), torch.tensor([3, 0, 3])),
    Case("segment_reduce_prod_offsets_axis1",
         lambda x, o: torch.segment_reduce(x, "prod", offsets=o, axis=1),
         randn(2, 5), torch.tensor([[0, 2, 5], [0, 0, 5]])),
]

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=5e-2, rtol=3e-2)}


def _run(case, dtype, device):
    inputs, wrt = [], []
    for i, x in enumerate(case.inputs):
        x = x.to(dtype) if x.is_floating_point() else x
        x = x.to(device)
        if x.is_floating_point() and (case.diff is None or i in case.diff):
            x.requires_grad_()
            wrt.append(x)
        inputs.append(x)
    out = case.fn(*inputs)
    cot = torch.randn(out.shape, generator=_gen(7)).to(dtype).to(device)
    grads = torch.autograd.grad(out, wrt, cot) if wrt else ()
    return [out, *grads]


@parametrize("case,dtype", [(c.name, (c,), [torch.float32] + [torch.bfloat16] * c.bf16)
                             for c in CASES])
def test_op_forward_backward(eager, case, dtype):
    expected = _run(case, dtype, "cpu")
    got = _run(case, dtype, "tpu")
    for g, e in zip(got, expected):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), e, **TOL[dtype])


def _sdpa_inputs(device, requires_grad=True):
    q, k, v = randn(2, 4, 6, 8, seed=1), randn(2, 2, 6, 8, seed=2), randn(2, 2, 6, 8, seed=3)
    return [x.to(device).requires_grad_(requires_grad) for x in (q, k, v)]


def _dispatches():
    from torch_tpu import metrics
    return sum(n for k, n in metrics.counters.items() if k.startswith("dispatches."))


def test_sdpa_is_one_fused_op_each_way(eager):
    """F.scaled_dot_product_attention on tpu takes torch's "overrideable" backend: one
    forward op and one backward op, not the math path's dozen small ones."""
    q, k, v = _sdpa_inputs("tpu")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    loss = out.sum()
    assert out.grad_fn.name() == "ScaledDotProductFusedAttentionOverrideableBackward0"
    before = _dispatches()
    torch.autograd.grad(loss, (q, k, v))
    # sum's backward (an expand of the ones: a view, no dispatch) and the attention's
    assert _dispatches() - before <= 2


def test_sdpa_backend_choice_follows_torch(eager):
    """The user's backend selection, dropout and a mask beside is_causal keep torch's math
    path on tpu too, with its results and its errors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = _sdpa_inputs("tpu")
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert "Overrideable" not in out.grad_fn.name()
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(*_sdpa_inputs("cpu"), is_causal=True,
                                             enable_gqa=True)
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
    torch.manual_seed(0)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, enable_gqa=True)
    assert "Overrideable" not in out.grad_fn.name()
    mask = torch.ones(6, 6, dtype=torch.bool, device="tpu")
    with pytest.raises(RuntimeError, match="is_causal"):
        F.scaled_dot_product_attention(q, k, v, mask, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bicubic", False),
                                             ("bilinear", True), ("bicubic", True)])
def test_float64_interpolation_keeps_float64_positions(eager, mode, antialias):
    """A float64 input's sampling positions and weights are computed in double, as CPU's
    kernels do (they were float32's, 2e-7 off: a silent loss of precision)."""
    x = torch.randn(1, 2, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for size in ((3, 4), (9, 11)):
        ref = F.interpolate(x, size=size, mode=mode, antialias=antialias)
        got = F.interpolate(x.to("tpu"), size=size, mode=mode, antialias=antialias)
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-12, atol=1e-12)


def test_sdpa_named_cuda_kernels_take_the_fused_op(eager):
    """A script that asks for CUDA's fused kernels by name, as torchtitan does
    (`sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH])`), gets tpu's fused attention, as
    it gets flash on CUDA; its values and gradients match CPU's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    q, k, v = _sdpa_inputs("tpu")
    with sdpa_kernel(backends, set_priority=True):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.grad_fn.name() == "ScaledDotProductFusedAttentionOverrideableBackward0"
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    cq, ck, cv = _sdpa_inputs("cpu")
    with sdpa_kernel(backends, set_priority=True):
        ref = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref.square().sum(), (cq, ck, cv))
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu(), r, **TOL[torch.float32])


def test_sdpa_query_that_sees_no_key_gives_zeros(eager):
    """torch's math path (_safe_softmax) gives 0 for a fully masked query row, not NaN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2] = False
    q, k, v = _sdpa_inputs("tpu")
    out = F.scaled_dot_product_attention(q, k, v, mask.to("tpu"), enable_gqa=True)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    cq, ck, cv = _sdpa_inputs("cpu")
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(cq, ck, cv, mask, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref.sum(), (cq, ck, cv))
    assert torch.all(out[:, :, 2].cpu() == 0)
    for g, e in zip([out, *grads], [ref, *ref_grads]):
        torch.testing.assert_close(g.cpu(), e, **TOL[torch.float32])


def _weight_grad_error(device, dtype, x, w, go, stride):
    ww = w.to(device, dtype, copy=True).requires_grad_()
    F.conv2d(x.to(device, dtype), ww, stride=stride).backward(go.to(device, dtype))
    return ww.grad.cpu().double()


def test_patch_embedding_weight_gradient_is_as_accurate_as_cpus(eager):
    """AST's patch embedding (16x16 kernel, stride 10, 2x12x101 positions): the weight
    gradient sums 2,424 terms per element; XLA's transposed convolution summed them 2.7x
    further from float64 than CPU's kernel, which the model zoo's training step caught
    (lowering/conv.py, _weight_grad_by_patches)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 128, 1024, generator=g)
    w = torch.randn(64, 1, 16, 16, generator=g) * 0.02
    go = torch.randn(2, 64, 12, 101, generator=g) * 1e-3
    ref = _weight_grad_error("cpu", torch.float64, x, w, go, 10)

    def rmse(a):
        return float((a - ref).pow(2).mean().sqrt())
    cpu, tpu = (rmse(_weight_grad_error(d, torch.float32, x, w, go, 10))
                for d in ("cpu", "tpu"))
    assert tpu <= 1.5 * cpu, (tpu, cpu)


def test_batch_norm_updates_running_stats(eager):
    x, w, b = randn(4, 3, 5), randn(3, seed=1), randn(3, seed=2)
    results = {}
    for device in ("cpu", "tpu"):
        mean, var = torch.zeros(3, device=device), torch.ones(3, device=device)
        out = aten._native_batch_norm_legit(x.to(device), w.to(device), b.to(device), mean, var,
                                            True, 0.1, 1e-5)
        results[device] = [out[0], mean, var]
    for g, e in zip(results["tpu"], results["cpu"]):
        torch.testing.assert_close(g.cpu(), e, **TOL[torch.float32])


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batch_norm_module(eager, train):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3).train(train)
    bn.running_mean.normal_()
    x = randn(4, 3, 2, 2)
    bn_tpu = copy.deepcopy(bn).to("tpu")
    expected, got = bn(x), bn_tpu(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), expected, **TOL[torch.float32])
    torch.testing.assert_close(bn_tpu.running_mean.cpu(), bn.running_mean)
    torch.testing.assert_close(bn_tpu.running_var.cpu(), bn.running_var)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batch_norm_on_the_inputs_trains_its_affine_only(eager, train):
    """A batch norm on the model's inputs (CLAP's spectrogram): nothing needs the input's
    gradient, and torch's kernels still give it; the weight and bias get CPU's."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3).train(train)
    bn_tpu = copy.deepcopy(bn).to("tpu")
    x = randn(2, 3, 4, 4)
    bn(x).pow(2).sum().backward()
    bn_tpu(x.to("tpu")).pow(2).sum().backward()
    for got, want in ((bn_tpu.weight.grad, bn.weight.grad), (bn_tpu.bias.grad, bn.bias.grad)):
        torch.testing.assert_close(got.cpu(), want, **TOL[torch.float32])


def test_batch_norm_with_update(eager):
    x, w, b = randn(4, 3, 5), randn(3, seed=1), randn(3, seed=2)
    results = {}
    for device in ("cpu", "tpu"):
        mean, var = torch.zeros(3, device=device), torch.ones(3, device=device)
        out = aten._batch_norm_with_update(x.to(device), w.to(device), b.to(device), mean, var,
                                           0.1, 1e-5)
        results[device] = [*out[:3], mean, var]
    for g, e in zip(results["tpu"], results["cpu"]):
        torch.testing.assert_close(g.cpu(), e, **TOL[torch.float32])


def test_rrelu_eval_and_gradient(eager):
    x = randn(3, 7)
    expected = F.rrelu(x, 0.1, 0.4, training=False)
    xt = x.to("tpu").requires_grad_()
    got = F.rrelu(xt, 0.1, 0.4, training=False)
    torch.testing.assert_close(got.cpu(), expected)
    (grad,) = torch.autograd.grad(got.sum(), xt)
    torch.testing.assert_close(grad.cpu(), torch.where(x > 0, 1.0, 0.25))


def test_rrelu_training_draws_slopes(eager):
    x = -torch.rand(4000).to("tpu").requires_grad_()
    torch.manual_seed(5)
    out = F.rrelu(x, 0.2, 0.3, training=True)
    (grad,) = torch.autograd.grad(out.sum(), x)
    slope = (out / x).detach().cpu()
    assert 0.2 <= slope.min().item() and slope.max().item() <= 0.3
    assert abs(slope.mean().item() - 0.25) < 0.005
    torch.testing.assert_close(grad.cpu(), slope)  # d(x * noise)/dx = noise
    torch.manual_seed(5)
    torch.testing.assert_close(F.rrelu(x, 0.2, 0.3, training=True).detach().cpu(),
                               out.detach().cpu())


@pytest.mark.parametrize("weights", [False, True], ids=["counts", "weights"])
def test_bincount(eager, weights):
    x = torch.tensor([4, 1, 1, 0, 7, 4, 4])
    w = probs(7) if weights else None
    for minlength in (0, 10):
        expected = torch.bincount(x, w, minlength)
        got = torch.bincount(x.to("tpu"), None if w is None else w.to("tpu"), minlength)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected)


def test_histogram(eager):
    x = randn(50)
    w = probs(50, seed=1)
    for kwargs in (dict(bins=7), dict(bins=5, range=(-1.0, 0.5), weight=w, density=True),
                   dict(bins=torch.tensor([-2.0, -0.5, 0.0, 0.2, 3.0]), weight=w)):
        expected = torch.histogram(x, **kwargs)
        tpu_kwargs = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v
                      for k, v in kwargs.items()}
        got = torch.histogram(x.to("tpu"), **tpu_kwargs)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.cpu(), e)
    # constant data: the range widens by 0.5 each way
    got = torch.histogram(torch.full((4,), 2.0).to("tpu"), 2)
    torch.testing.assert_close(got.bin_edges.cpu(), torch.tensor([1.5, 2.0, 2.5]))


def test_histogramdd(eager):
    x = randn(40, 3)
    for bins in ([3, 4, 2], [torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-3.0, 3.0]),
                             torch.tensor([-0.5, 0.5, 1.0])]):
        expected = torch.histogramdd(x, bins, weight=probs(40), density=True)
        got = torch.histogramdd(x.to("tpu"), [b.to("tpu") if isinstance(b, torch.Tensor) else b
                                              for b in bins], weight=probs(40).to("tpu"),
                                density=True)
        torch.testing.assert_close(got.hist.cpu(), expected.hist)
        for g, e in zip(got.bin_edges, expected.bin_edges):
            torch.testing.assert_close(g.cpu(), e)


def test_empty_searchsorted_and_nonzero_static(eager):
    seq, values = torch.empty(0, 3), torch.empty(0, 2)
    got = torch.searchsorted(seq.to("tpu"), values.to("tpu"))
    assert got.shape == (0, 2) and got.dtype == torch.int64
    x = torch.empty(5, 0, 5)
    torch.testing.assert_close(torch.nonzero_static(x.to("tpu"), size=3, fill_value=-2).cpu(),
                               torch.nonzero_static(x, size=3, fill_value=-2))


def test_dropout_mask_and_gradient(eager):
    x = torch.ones(4000, device="tpu", requires_grad=True)
    out = F.dropout(x, p=0.25, training=True)
    (grad,) = torch.autograd.grad(out.sum(), x)
    out, grad = out.cpu(), grad.cpu()
    kept = out != 0
    assert 0.7 < kept.float().mean().item() < 0.8
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.75))
    torch.testing.assert_close(grad, out)  # d(x * mask * scale)/dx = mask * scale


def test_dropout_seeded_and_eval(eager):
    x = randn(64).to("tpu")
    torch.manual_seed(3)
    a = F.dropout(x, 0.5).cpu()
    torch.manual_seed(3)
    b = F.dropout(x, 0.5).cpu()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(F.dropout(x, 0.5, training=False).cpu(), x.cpu())


def _train(model, device, steps=3):
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x = randn(4, 3, 8, 8, seed=10 + step).to(device)
        y = randint(10, (4,), seed=20 + step).to(device)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_tiny_cnn_sgd_parity(eager):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, stride=2, bias=False), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    cpu_model = copy.deepcopy(model)
    cpu_losses = _train(cpu_model, "cpu")
    tpu_losses = _train(model, "tpu")
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses),
                               atol=1e-5, rtol=1e-4)
    for (name, got), expected in zip(model.state_dict().items(), cpu_model.state_dict().values()):
        torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4, msg=name)


def test_mlp_with_dropout_eval(eager):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 3)).eval()
    x = randn(5, 6)
    expected = model(x)
    got = copy.deepcopy(model).to("tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_forward_and_backward(eager, dim):
    """nn.utils.weight_norm (EnCodec, UniSpeech, WavTokenizer): _weight_norm_interface and
    its backward."""
    import warnings

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(3, 4, 3), dim=dim)
    x = torch.randn(2, 3, 8)

    def run(device):
        m = conv.to(device)  # weight_norm's computed weight holds weight_g/weight_v
        m.zero_grad()
        y = m(x.to(device))
        (y * y).sum().backward()
        return [y.detach().cpu()] + [p.grad.cpu().clone() for p in m.parameters()]

    want = run("cpu")
    torch.testing.assert_close(run("tpu"), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls,kw", [(torch.nn.LSTM, {}), (torch.nn.GRU, {}),
                                    (torch.nn.LSTMCell, {}), (torch.nn.GRUCell, {}),
                                    (torch.nn.LSTM, dict(bias=False, num_layers=2)),
                                    (torch.nn.GRU, dict(bias=False, batch_first=True))])
def test_recurrent_layers_forward_and_backward(eager, cls, kw):
    """nn.LSTM/GRU and their cells reach the fused cells (_thnn_fused_*), as on CUDA."""
    import copy

    torch.manual_seed(0)
    m = cls(4, 3, **kw)
    x = torch.randn(5, 4) if "Cell" in cls.__name__ else torch.randn(2, 5, 4)

    def run(device):
        mm = copy.deepcopy(m).to(device)
        xx = x.clone().to(device).requires_grad_()
        out = mm(xx)
        y = out[0] if isinstance(out, tuple) else out
        loss = (y * y).sum()
        if isinstance(out, tuple) and isinstance(out[1], tuple):  # LSTM's (h, c)
            loss = loss + out[1][1].sum()
        loss.backward()
        return [y.detach().cpu(), xx.grad.cpu()] + [p.grad.cpu() for p in mm.parameters()]

    torch.testing.assert_close(run("tpu"), run("cpu"), rtol=1e-4, atol=1e-5)
