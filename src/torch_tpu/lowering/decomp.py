"""The explicit lists: ops that run as torch's own decomposition (into ops we lower), and
ops that run on CPU, each with its reason. Nothing reaches either list by accident.

One list serves every mode: the eager fallback runs a listed op's decomposition on tpu
tensors, and the compile backend hands the same table to AOTAutograd, so an op that works
compiled works eagerly too. Most of these never reach a tpu kernel in eager, because
torch's C++ composite kernels decompose them first; in a traced aten graph they arrive
whole. tests/unit/test_lowering_tables.py checks that no listed op also has a lowering.
"""
from __future__ import annotations

import torch
from torch._decomp import decomposition_table
from torch._decomp.decompositions import native_batch_norm_decomposition

aten = torch.ops.aten

# why -> the ops whose torch decomposition is the right lowering for that reason
_REASONS = {
    "nn.BatchNorm reaches native_batch_norm, whose schema does not mark running_mean/"
    "running_var as mutated, so no lowering could write them back; torch's decomposition "
    "redirects to _native_batch_norm_legit(_no_training), which marks them and is lowered": [
        aten.native_batch_norm.default, aten.native_batch_norm.out,
        aten._batch_norm_no_update.default,
        aten.cudnn_batch_norm.default, aten.cudnn_batch_norm.out,
        aten.cudnn_batch_norm_backward.default, aten.cudnn_batch_norm_backward.out,
        aten.miopen_batch_norm_backward.default, aten.miopen_batch_norm_backward.out],
    "the backward of a view op: a zero tensor with the gradient scattered into the view "
    "(new_zeros + *_scatter, both lowered)": [
        aten.select_backward.default, aten.select_backward.out,
        aten.slice_backward.default, aten.slice_backward.out,
        aten.diagonal_backward.default, aten.diagonal_backward.out],
    "in-place Python operators (&=, |=, ^=, <<=, >>=) are their bitwise ops' in-place "
    "forms, which are lowered": [
        aten.__iand__.Scalar, aten.__iand__.Tensor, aten.__ior__.Scalar, aten.__ior__.Tensor,
        aten.__ixor__.Scalar, aten.__ixor__.Tensor, aten.__ilshift__.Scalar,
        aten.__ilshift__.Tensor, aten.__irshift__.Scalar, aten.__irshift__.Tensor,
        aten.ldexp_.default],
    "recurrent layers: a loop of the cell's matmuls and pointwise ops, all lowered": [
        aten.lstm.input, aten.lstm.data, aten.gru.input, aten.gru.data,
        aten.rnn_tanh.input, aten.rnn_tanh.data, aten.rnn_relu.input, aten.rnn_relu.data],
    "the .vec overloads compute the output size from scale factors, then call the lowered "
    "overload with explicit sizes; the anti-aliased and exact-nearest variants are "
    "written in gathers and weighted sums": [
        aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec, aten.upsample_nearest3d.vec,
        aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact2d.vec,
        aten._upsample_nearest_exact3d.vec, aten.upsample_bilinear2d.vec,
        aten.upsample_bicubic2d.vec, aten.upsample_trilinear3d.vec,
        aten._upsample_bilinear2d_aa.vec, aten._upsample_bicubic2d_aa.vec,
        aten._upsample_lanczos2d_aa.vec],
    "dropout: a Bernoulli mask (lowered, seeded from the tpu generator) times the input": [
        aten.dropout.default, aten._fused_dropout.default, aten._fused_dropout.out],
    "a formula of lowered pointwise ops and reductions": [
        aten.dist.default, aten.dist.out, aten._euclidean_dist.default,
        aten._euclidean_dist.out, aten.soft_margin_loss.default, aten.soft_margin_loss.out,
        aten.soft_margin_loss_backward.default, aten.soft_margin_loss_backward.grad_input,
        aten._fused_rms_norm.default, aten._fused_rms_norm_backward.default,
        aten.hann_window.default, aten.hann_window.out, aten.hann_window.periodic,
        aten.hann_window.periodic_out, aten.affine_grid_generator.default,
        aten.affine_grid_generator.out, aten.conj_physical.out],
    "the CPU's flash-attention entry that dynamo may trace: attention as matmuls and "
    "softmax (tpu's own SDPA op is lowered directly)": [
        aten._scaled_dot_product_flash_attention_for_cpu.default],
    "shape plumbing: splits, concatenations, padding and masked indexing written in "
    "lowered view and copy ops": [
        aten._chunk_cat.default, aten._chunk_cat.out, aten.unsafe_split.Tensor,
        aten.unsafe_split_with_sizes.default, aten.pad_sequence.default,
        aten._unsafe_masked_index.default, aten._unsafe_masked_index_put_accumulate.default],
    "no new value: a copy, a resize to another tensor's shape, or a shape comparison": [
        aten._to_copy.out, aten._unsafe_view.out, aten.lift.default, aten.lift.out,
        aten.resize_as.default, aten.resize_as.out, aten.is_same_size.default],
}

REASONS = {op: why for why, ops in _REASONS.items() for op in ops}
# op -> torch's decomposition of it; native_batch_norm takes the one that redirects to the
# mutating _native_batch_norm_legit (the table's own computes new running stats as values)
DECOMPOSITIONS = {op: decomposition_table[op] for op in REASONS}
DECOMPOSITIONS[aten.native_batch_norm.default] = native_batch_norm_decomposition

# op -> why it runs on CPU (counted in metrics.fallback_ops, warned once per op)
_LDL = ("LAPACK's Bunch-Kaufman LDL^T (sytrf/sytrs): its LD and pivots are LAPACK's own "
        "format, which XLA has no decomposition for")
CPU_FALLBACKS: dict = {
    aten.linalg_ldl_factor_ex.default: _LDL,
    aten.linalg_ldl_factor_ex.out: _LDL,
    aten.linalg_ldl_solve.default: _LDL,
    aten.linalg_ldl_solve.out: _LDL,
}
