"""PyTorch's device-generic op checks, a sample of ops, through torch's own machinery:
`instantiate_device_type_tests` makes the tpu class from PrivateUse1TestBase and `@ops`
feeds it OpInfos, as torch's test/test_ops.py is instantiated for CUDA. The families
(torch_tpu_tools/validation/conformance.py) run in Strict, DeferAndFuse and compiled; the
whole op database runs behind `python -m torch_tpu validate conformance` (docs/CONFORMANCE.md).
A failure listed in the expected failures (validation/expected/conformance.json, with its
reason) is an expected failure here; one that passes again fails the test (strict xfail).
"""
import unittest

import pytest
import torch
from torch.testing._internal.common_device_type import (OpDTypes, instantiate_device_type_tests,
                                                        ops)
from torch.testing._internal.common_utils import TestCase

import torch_tpu  # noqa: F401
from torch_tpu_tools.validation import conformance, ops as sweep_ops, report

# common ops of real models, each family represented: pointwise with out=, reductions,
# matmuls, indexing with error inputs, shape ops, factories, random, nn functional
SAMPLE = {"add", "mul", "exp", "where", "clamp", "sum", "amax", "std", "mm", "addmm",
          "matmul", "cat", "index_select", "gather", "masked_fill", "softmax", "cumsum",
          "transpose", "arange", "full", "nn.functional.dropout", "nn.functional.layer_norm",
          "nn.functional.scaled_dot_product_attention", "topk"}
OPS = [o for o in sweep_ops.op_db() if sweep_ops.op_name(o) in SAMPLE]
EXPECTED = report.load_expected("conformance")


def _family_test(family, mode):
    def test(self, device, dtype, op):
        reason = EXPECTED.get(sweep_ops.op_name(op), {}).get(f"{family} {mode}")
        torch_says = conformance.declared(family, op)
        if torch_says:  # as torch's own suite would: not asked of any device
            raise unittest.SkipTest(torch_says)
        try:
            conformance.run(family, op, mode)
        except conformance.NotApplicable as e:
            raise unittest.SkipTest(str(e)) from None
        except conformance.Failed as e:
            if reason:
                pytest.xfail(reason)
            raise AssertionError(f"{family} {mode}: {e}") from None
        if reason:
            pytest.fail(f"listed as an expected failure, now passes: {reason}")
    test.__name__ = f"test_{family}_{mode}"
    if mode != "strict":  # --fast keeps Strict's; CI runs all
        test = pytest.mark.slow(test)
    return ops(OPS, dtypes=OpDTypes.any_one)(test)


class TestConformance(TestCase):
    pass


for _mode in conformance.MODES:
    for _family in conformance.FAMILIES:
        if _mode == "compiled" and _family not in ("compare", "errors", "out"):
            continue  # the rest run in the sweep: dynamo compiles each sample anew
        setattr(TestConformance, f"test_{_family}_{_mode}", _family_test(_family, _mode))

instantiate_device_type_tests(TestConformance, globals(), only_for=("privateuse1",))


def test_sample_is_instantiated_for_tpu():
    """Every op of the sample is in torch's op_db, and the class torch made is tpu's."""
    assert {sweep_ops.op_name(o) for o in OPS} == SAMPLE
    cls = globals()["TestConformancePRIVATEUSE1"]
    assert any(n.endswith("_tpu_float32") for n in dir(cls))
