"""Shape and indexing ops on tpu against CPU: cat, pads, flip/roll, tril/triu, repeat, the
functional *_copy/*_scatter ops, advanced indexing and index_put (integer and boolean
indices), gather/scatter and the index_* family, searchsorted, and the ops whose result
shape depends on values (nonzero, masked_select, unique, repeat_interleave); each in Strict
and in DeferAndFuse (the `eager` fixture)."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_tpu.lowering import registry

from helpers.mode_matrix import parametrize

aten = torch.ops.aten


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=_gen(seed))


def randint(low, high, shape, seed=0):
    return torch.randint(low, high, shape, generator=_gen(seed))


def mask(*shape, seed=0):
    return torch.rand(*shape, generator=_gen(seed)) > 0.5


def _tpu(v):
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, (list, tuple)):
        return type(v)(_tpu(x) for x in v)
    return v


def _cpu(v):
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu(x) for x in v)
    return v


def _cast(v, dtype):
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.to(dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(x, dtype) for x in v)
    return v


def _as_int(v):
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return (v * 10).long()
    if isinstance(v, (list, tuple)):
        return type(v)(_as_int(x) for x in v)
    return v


class Case:
    """fn(*inputs) on tpu against CPU, in float32 and int64 (`ints=False`: float only),
    plus bfloat16 where rounding matters (`bf16`); `grad` checks autograd through the float
    inputs."""

    def __init__(self, name, fn, *inputs, grad=False, ints=True, bf16=False):
        self.name, self.fn, self.inputs, self.grad = name, fn, inputs, grad
        self.dtypes = [torch.float32] + [torch.bfloat16] * bf16 + [torch.int64] * ints

    def __repr__(self):
        return self.name


def _setitem(indices):
    def fn(x, v):
        y = x.clone()
        y[indices(y)] = v
        return y

    return fn


def _iadd(indices):
    def fn(x, v):
        y = x.clone()
        y[indices(y)] += v
        return y

    return fn


IDX = torch.tensor([2, 0, -1, 2])
IDX2 = torch.tensor([[0, 1], [3, 2]])
M45 = mask(4, 5, seed=3)
GIDX = randint(0, 5, (4, 3), seed=4)

CASES = [
    # ------------------------------------------------ cat / pads / reorder
    Case("cat", lambda a, b: torch.cat([a, b], 1), randn(3, 2), randn(3, 4, seed=1), grad=True, bf16=True),
    Case("cat_neg_dim_skip_empty", lambda a, b: torch.cat([a, a.new_zeros(0), b], -2),
         randn(2, 3), randn(1, 3, seed=1), grad=True),
    Case("stack", lambda a, b: torch.stack([a, b], 2), randn(3, 2), randn(3, 2, seed=1), grad=True),
    Case("constant_pad", lambda x: F.pad(x, (1, 2, -1, 1), value=2.5), randn(2, 4, 3), grad=True, bf16=True),
    Case("reflect_pad1d", lambda x: F.pad(x, (2, 1), mode="reflect"), randn(2, 3, 5), grad=True,
         ints=False),
    Case("reflect_pad2d", lambda x: F.pad(x, (1, 2, 2, 0), mode="reflect"), randn(1, 2, 4, 5),
         grad=True, ints=False, bf16=True),
    Case("replicate_pad2d_neg", lambda x: F.pad(x, (-1, 3, 2, 1), mode="replicate"),
         randn(1, 2, 4, 4), grad=True, ints=False),
    Case("replicate_pad3d", lambda x: F.pad(x, (1, 1, 0, 2, 1, 0), mode="replicate"),
         randn(1, 1, 2, 3, 3), grad=True, ints=False),
    Case("flip", lambda x: torch.flip(x, (0, 2)), randn(2, 3, 4), grad=True),
    Case("roll", lambda x: torch.roll(x, (1, -2), (0, 1)), randn(3, 4), grad=True),
    Case("roll_flat", lambda x: torch.roll(x, 5), randn(3, 4)),
    Case("tril", lambda x: torch.tril(x, -1), randn(2, 4, 5), grad=True),
    Case("triu", lambda x: torch.triu(x, 2), randn(4, 5), grad=True),
    Case("repeat", lambda x: x.repeat(2, 1, 3), randn(3, 2), grad=True),
    Case("tril_indices", lambda: torch.tril_indices(4, 3, -1, device=DEV[0]), ints=False),
    Case("triu_indices", lambda: torch.triu_indices(3, 5, 1, device=DEV[0]), ints=False),
    # ------------------------------------------------ functional views
    Case("t_copy", lambda x: aten.t_copy(x), randn(3, 4)),
    Case("transpose_copy", lambda x: aten.transpose_copy(x, 0, 2), randn(2, 3, 4)),
    Case("permute_copy", lambda x: aten.permute_copy(x, [2, 0, 1]), randn(2, 3, 4)),
    Case("view_copy", lambda x: aten.view_copy(x, [4, -1]), randn(2, 3, 4)),
    Case("expand_copy", lambda x: aten.expand_copy(x, [2, -1, 3]), randn(4, 1)),
    Case("slice_copy", lambda x: aten.slice_copy(x, 1, 1, -1, 2), randn(3, 7)),
    Case("select_copy", lambda x: aten.select_copy(x, 1, -1), randn(3, 4)),
    Case("unsqueeze_copy", lambda x: aten.unsqueeze_copy(x, -1), randn(3, 4)),
    Case("squeeze_copy_dims", lambda x: aten.squeeze_copy(x, [0, 1]), randn(1, 3, 1)),
    Case("squeeze_copy_all", lambda x: aten.squeeze_copy(x), randn(1, 3, 1)),
    Case("split_with_sizes_copy", lambda x: aten.split_with_sizes_copy(x, [1, 3], 1), randn(2, 4)),
    Case("unbind_copy", lambda x: aten.unbind_copy(x, 1), randn(2, 3)),
    Case("diagonal_copy", lambda x: aten.diagonal_copy(x, -1, 2, 0), randn(4, 2, 3)),
    Case("alias_copy", lambda x: aten.alias_copy(x), randn(3)),
    Case("unfold", lambda x: x.unfold(1, 3, 2) * 1, randn(2, 7), grad=True),
    Case("unfold_copy_overlap", lambda x: aten.unfold_copy(x, -1, 2, 1), randn(3, 4)),
    Case("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 1, 0, 6, 2), randn(2, 6),
         randn(2, 3, seed=1), grad=True, bf16=True),
    Case("select_scatter", lambda x, s: torch.select_scatter(x, s, 0, -1), randn(3, 4),
         randn(4, seed=1), grad=True),
    Case("diagonal_scatter", lambda x, s: torch.diagonal_scatter(x, s, 1, 0, 2), randn(3, 2, 4),
         randn(2, 3, seed=1), grad=True),
    # ------------------------------------------------ advanced indexing
    Case("index_dim0", lambda x, i: x[i], randn(4, 5), IDX, grad=True, bf16=True),
    Case("index_dim1_2d", lambda x, i: x[:, i], randn(3, 4), IDX2, grad=True),
    Case("index_two_adjacent", lambda x, i, j: x[:, i, j], randn(2, 4, 5), IDX, IDX, grad=True),
    Case("index_separated", lambda x, i, j: x[i, :, j], randn(4, 3, 5), IDX, IDX, grad=True),
    Case("index_bool_mask", lambda x, m: x[m], randn(4, 5), M45, grad=True, bf16=True),
    Case("unsafe_index", lambda x, i: aten._unsafe_index(x, [None, i]), randn(3, 4), IDX2 % 4),
    Case("unsafe_index_put_acc", lambda x, i, v: aten._unsafe_index_put(x, [i], v, True),
         randn(4, 3), IDX, randn(3, seed=1)),
    Case("index_bool_dim1", lambda x, m: x[:, m[0]], randn(3, 5), M45, grad=True),
    Case("index_put", lambda x, i, v: x.index_put((i,), v), randn(4, 5), torch.tensor([0, 3]),
         randn(2, 5, seed=1), grad=True),
    Case("index_put_accumulate_dups", lambda x, i, v: x.index_put((i,), v, accumulate=True),
         randn(4, 5), IDX, randn(4, 5, seed=1), grad=True, bf16=True),
    Case("setitem_int_slice", _setitem(lambda y: (torch.tensor([1, 3], device=y.device), slice(1, 3))),
         randn(4, 5), randn(2, 2, seed=1), grad=True),
    Case("setitem_mask_scalar", _setitem(lambda y: y > 0), randn(4, 5), torch.tensor(0.5)),
    Case("setitem_mask_values", _setitem(lambda y: M45.to(y.device)), randn(4, 5),
         randn(int(M45.sum()), seed=1), grad=True, bf16=True),
    Case("setitem_row_mask_rows", _setitem(lambda y: M45[:, 1].to(y.device)), randn(4, 5),
         randn(int(M45[:, 1].sum()), 5, seed=1)),
    Case("setitem_empty_mask", _setitem(lambda y: M45[:, 0].to(y.device)), randn(4, 5),
         randn(0, 5, seed=1)),
    Case("iadd_mask_dim1", _iadd(lambda y: (slice(None), M45[1].to(y.device))), randn(4, 5),
         randn(4, 1, seed=1)),
    Case("setitem_mask_and_index",
         _setitem(lambda y: (M45[:, 1].to(y.device), torch.tensor(1, device=y.device))),
         randn(4, 5), randn(int(M45[:, 1].sum()), seed=1)),
    # ------------------------------------------------ gather / scatter
    Case("gather", lambda x, i: x.gather(1, i), randn(4, 6), GIDX, grad=True, bf16=True),
    Case("gather_smaller_index", lambda x, i: x.gather(0, i[:2, :2] % 3), randn(3, 4), GIDX,
         grad=True),
    Case("take_along_dim", lambda x, i: torch.take_along_dim(x, i, 1), randn(4, 6), GIDX),
    Case("scatter_src", lambda x, i, s: x.scatter(1, i, s), randn(4, 6), GIDX,
         randn(4, 3, seed=1), grad=True),
    Case("scatter_src_larger", lambda x, i, s: x.scatter(1, i[:, :1], s), randn(4, 6), GIDX,
         randn(4, 3, seed=1)),
    Case("scatter_value", lambda x, i: x.scatter(1, i, 1.5), randn(4, 6), GIDX),
    Case("scatter_reduce_legacy_add", lambda x, i, s: x.scatter(1, i, s, reduce="add"), randn(4, 6),
         GIDX, randn(4, 3, seed=1)),
    Case("scatter_add", lambda x, i, s: x.scatter_add(1, i, s), randn(4, 6), GIDX,
         randn(4, 3, seed=1), grad=True, bf16=True),
    Case("scatter_reduce_sum_excl", lambda x, i, s: x.scatter_reduce(1, i, s, "sum", include_self=False),
         randn(4, 6), GIDX, randn(4, 3, seed=1), grad=True),
    Case("scatter_reduce_mean", lambda x, i, s: x.scatter_reduce(1, i, s, "mean"), randn(4, 6),
         GIDX, randn(4, 3, seed=1), bf16=True),
    Case("scatter_reduce_amax", lambda x, i, s: x.scatter_reduce(1, i, s, "amax", include_self=False),
         randn(4, 6), GIDX, randn(4, 3, seed=1), grad=True),
    Case("scatter_reduce_prod", lambda x, i, s: x.scatter_reduce(0, i % 4, s, "prod"), randn(4, 6),
         GIDX, randn(4, 3, seed=1)),
    Case("index_select", lambda x, i: x.index_select(1, i % 5), randn(3, 5), IDX, grad=True),
    Case("index_add", lambda x, i, s: x.index_add(0, i % 4, s, alpha=2), randn(4, 3), IDX,
         randn(4, 3, seed=1), grad=True, bf16=True),
    Case("index_copy", lambda x, s: x.index_copy(1, torch.tensor([2, 0], device=x.device), s),
         randn(3, 4), randn(3, 2, seed=1), grad=True),
    Case("index_fill", lambda x, i: x.index_fill(1, i % 4, -2.0), randn(3, 4), IDX, grad=True),
    Case("index_reduce_amin", lambda x, i, s: x.index_reduce(0, i % 4, s, "amin"), randn(4, 3),
         IDX, randn(4, 3, seed=1)),
    Case("take", lambda x, i: torch.take(x, i), randn(3, 4), torch.tensor([[0, -1], [11, 5]]),
         grad=True),
    Case("put_accumulate", lambda x, i, s: x.put(i, s, accumulate=True), randn(3, 4),
         torch.tensor([1, -1, 1]), randn(3, seed=1), grad=True, bf16=True),
    Case("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), randn(4, 5), M45,
         randn(20, seed=1), grad=True, bf16=True),
    Case("masked_scatter_broadcast", lambda x, m, s: x.masked_scatter(m, s), randn(5), M45,
         randn(20, seed=1)),
    # ------------------------------------------------ sorted search
    Case("searchsorted", lambda s, v: torch.searchsorted(s, v), torch.tensor([1.0, 2, 2, 5, 9]),
         randn(3, 4) * 4, bf16=True),
    Case("searchsorted_right_nd", lambda s, v: torch.searchsorted(s, v, right=True),
         torch.sort(randn(2, 5), dim=-1)[0], randn(2, 3, seed=1)),
    Case("searchsorted_sorter_int32",
         lambda s, v: torch.searchsorted(s, v, sorter=torch.argsort(s), side="right", out_int32=True),
         randn(6), randn(4, seed=1)),
    Case("bucketize", lambda v, b: torch.bucketize(v, b), randn(3, 4) * 2,
         torch.tensor([-1.0, 0.0, 0.5, 2.0])),
    Case("bucketize_right", lambda v, b: torch.bucketize(v, b, right=True),
         torch.tensor([[-1.0, 0.0, 3.0]]), torch.tensor([-1.0, 0.0, 0.5, 2.0])),
    # ------------------------------------------------ data-dependent shapes
    Case("nonzero", lambda m: torch.nonzero(m), M45, ints=False),
    Case("argwhere", lambda x: torch.argwhere(x > 0), randn(2, 3, 2)),
    Case("nonzero_static", lambda m: torch.nonzero_static(m, size=15, fill_value=-3), M45, ints=False),
    Case("masked_select", lambda x, m: torch.masked_select(x, m), randn(4, 5), M45, grad=True),
    Case("masked_select_broadcast", lambda x, m: torch.masked_select(x, m), randn(5), M45),
    Case("repeat_interleave_output_size",
         lambda r: torch.repeat_interleave(r, output_size=6), torch.tensor([2, 0, 3, 1]), ints=False),
    Case("repeat_interleave_self_int", lambda x: x.repeat_interleave(2, dim=0), randn(2, 3)),
]

DEV = ["cpu"]  # factories inside a case read their device here


def _run(case, dtype, device):
    DEV[0] = device
    inputs = _cast(case.inputs, dtype) if dtype != torch.int64 else _as_int(case.inputs)
    if device == "tpu":
        inputs = _tpu(inputs)
    return case.fn(*inputs)


@parametrize("case,dtype", [(c.name, (c,), c.dtypes) for c in CASES])
def test_forward(eager, case, dtype):
    expected = _run(case, dtype, "cpu")
    got = _cpu(_run(case, dtype, "tpu"))
    torch.testing.assert_close(got, expected)


GRAD_CASES = [c for c in CASES if c.grad]


@pytest.mark.parametrize("case", GRAD_CASES, ids=repr)
def test_backward(eager, case):
    def grads(device):
        DEV[0] = device
        leaves = [x.clone().to(device).requires_grad_(x.is_floating_point())
                  if isinstance(x, torch.Tensor) else x for x in case.inputs]
        out = case.fn(*leaves)
        cot = torch.randn(out.shape, generator=_gen(7)).to(device)
        diff = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        return [_cpu(g) for g in torch.autograd.grad(out, diff, cot, allow_unused=True)]

    for g, e in zip(grads("tpu"), grads("cpu")):
        torch.testing.assert_close(g, e)


def test_integer_indexing_is_jitted(eager):
    """index.Tensor is tagged dynamic_output_shape, but only boolean indices make its
    shape data-dependent: integer indexing must compile to an XLA program (in
    DeferAndFuse: join the fused graph), not run eagerly."""
    from torch_tpu import metrics

    # a shape that no other test, nor this test's other mode, indexes: a new cache entry
    x = randn(3, 7, 2 if eager == "strict" else 3).to("tpu")
    i = IDX.to("tpu")
    before = metrics.counters.copy()
    got = x[:, i]
    grew = metrics.counters - before
    if eager == "strict":
        assert grew["executables_compiled"] and not grew["dynamic_shape_ops"], grew
    else:  # an op that runs eagerly first flushes the graph recorded before it (the uploads)
        assert not [k for k in grew if k.startswith("flush.")], grew
    torch.testing.assert_close(got.cpu(), x.cpu()[:, IDX])


# ---------------------------------------------------------------- unique family
UNIQUE_CASES = {
    "unique_sorted_inverse_counts": lambda x: torch.unique(x, return_inverse=True, return_counts=True),
    "unique_plain": lambda x: torch.unique(x),
    "unique_dim": lambda x: torch.unique(x.reshape(4, 3), dim=0, return_inverse=True,
                                         return_counts=True),
    "unique_consecutive": lambda x: torch.unique_consecutive(x, return_inverse=True,
                                                             return_counts=True),
    "unique_consecutive_dim": lambda x: torch.unique_consecutive(
        x.reshape(6, 2).repeat_interleave(2, dim=0), dim=0, return_counts=True),
    # the raw ops: which outputs are empty when not asked for is part of their contract
    "aten_unique2_no_flags": lambda x: aten._unique2(x.reshape(3, 4)),
    "aten_unique_dim_no_flags": lambda x: aten.unique_dim(x.reshape(6, 2), 1),
    "aten_unique_consecutive_dim": lambda x: aten.unique_consecutive(x.reshape(3, 4), False, False, 0),
    "unique_float": lambda x: torch.unique(x.float() / 2, return_counts=True),
}


@pytest.mark.parametrize("name", list(UNIQUE_CASES))
def test_unique(eager, name):
    x = torch.tensor([3, 1, 1, 2, 3, 3, 0, 2, 2, 1, 5, 5])
    fn = UNIQUE_CASES[name]
    torch.testing.assert_close(_cpu(fn(x.to("tpu"))), fn(x))


def test_repeat_interleave_lowering_without_output_size():
    """Without output_size the length is data-dependent: the lowering works on concrete
    arrays (the executor runs it eagerly)."""
    fn = registry.LOWERINGS[aten.repeat_interleave.Tensor]
    got = fn(jnp.asarray([2, 0, 3]))
    np.testing.assert_array_equal(np.asarray(got), [0, 0, 2, 2, 2])


def test_repeat_interleave_tensor_repeats(eager):
    x, r = randn(3, 2), torch.tensor([1, 0, 2])
    torch.testing.assert_close(x.to("tpu").repeat_interleave(r.to("tpu"), dim=0).cpu(),
                               x.repeat_interleave(r, dim=0))


@pytest.mark.parametrize("invert", [False, True])
def test_isin_overloads(eager, invert):
    a = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for args in [(a, torch.tensor([2, 5])), (a, 3), (3, a)]:
        targs = [x.to("tpu") if isinstance(x, torch.Tensor) else x for x in args]
        assert torch.equal(torch.isin(*targs, invert=invert).cpu(), torch.isin(*args, invert=invert))


def test_index_with_host_index_tensors(eager):
    """As on CUDA, a device tensor takes index tensors from the host (ViLT indexes with
    torch.multinomial's CPU result); other ops still refuse mixed devices."""
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    i = torch.tensor([2, 0])
    assert torch.equal(t[i].cpu(), x[i])
    assert torch.equal(t[i, 1:].cpu(), x[i, 1:])
    t[i] = 5.0
    x[i] = 5.0
    assert torch.equal(t.cpu(), x)
    with pytest.raises(RuntimeError, match="same device"):
        t + torch.ones(3, 4)
