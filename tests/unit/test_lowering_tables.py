"""One lowering table, one decomposition list, one schema-facts class: for eager and compile
alike. These check that the single homes stay single."""
import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.compile import lower
from torch_tpu.op import opcall
from torch_tpu.lowering import decomp, registry, schema

aten = torch.ops.aten


def test_a_duplicate_registration_raises_in_either_table():
    some_lowered = next(iter(registry.LOWERINGS))
    some_graph_only = next(iter(registry.GRAPH_ONLY))
    for op in (some_lowered, some_graph_only):
        for graph_only in (False, True):
            with pytest.raises(RuntimeError, match="duplicate lowering"):
                registry.lowering(op, graph_only=graph_only)(lambda *a, **k: None)


def test_graph_only_rules_get_no_eager_kernel_and_are_not_lowered_ops():
    for op in registry.GRAPH_ONLY:
        assert registry.lookup(op) is None, op


def test_no_decomposed_op_is_also_lowered():
    both = [str(op) for op in decomp.DECOMPOSITIONS
            if registry.lookup(op) is not None or op in registry.GRAPH_ONLY]
    assert not both, f"listed for decomposition but lowered too (drop them from decomp.py): {both}"
    assert set(decomp.DECOMPOSITIONS) == set(decomp.REASONS)
    assert all(len(why) > 30 for why in decomp.REASONS.values())


def test_compile_uses_the_same_decompositions():
    from torch_tpu import compile as tpu_compile

    backend = tpu_compile._aot_backend()
    assert backend.kwargs["decompositions"] is decomp.DECOMPOSITIONS


@pytest.mark.parametrize("op", [aten.add.Tensor, aten.arange.start, aten.full.default,
                                aten.index_put_.default, aten._foreach_add_.Scalar,
                                aten.bernoulli.p, aten.native_layer_norm.default])
def test_eager_and_compile_share_the_schema_facts(op):
    fn = registry.lookup(op)
    plan, info = opcall.OpPlan(op, fn), lower.OpInfo(op, fn, False)
    for field in schema.OpSchema.__slots__:
        assert getattr(plan, field) == getattr(info, field), field


def test_factory_scalars_stay_numbers_in_both():
    info = lower.op_info(aten.arange.start)
    assert info.kinds[:2] == (schema.STATIC_NUMBER, schema.STATIC_NUMBER)
    assert lower.op_info(aten.full.default).kinds[1] == schema.STATIC_NUMBER


def test_a_listed_decomposition_runs_in_eager_and_compiled():
    """soft_margin_loss is listed once: eager's fallback and AOTAutograd both decompose it."""
    def f(x, y):
        return torch.ops.aten.soft_margin_loss(x, y, 1)

    x = torch.randn(4, 5)
    y = torch.randn(4, 5).sign()
    want = f(x, y)
    xt, yt = x.to("tpu"), y.to("tpu")
    torch.testing.assert_close(f(xt, yt).cpu(), want)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(xt, yt).cpu(), want)
