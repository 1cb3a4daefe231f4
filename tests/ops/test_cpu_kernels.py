"""ATen's CPU kernels inside XLA:CPU programs (_cpu_kernels.py, csrc/cpu_kernels.cpp): bf16
products and unmasked attention run oneDNN's kernels as XLA custom calls on the CPU
platform. A CUDA-style bf16 autocast training script (tests/user_code/
bf16_autocast_training.py) gives CPU's numbers with the kernels and without them, in each
mode; the dot's handler equals XLA's own dot for every layout of dimension numbers."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.dist_launch import run_single, swap_cuda
from jax import lax

from torch_tpu import _cpu_kernels

SCRIPT = pathlib.Path(__file__).parents[1] / "user_code" / "bf16_autocast_training.py"
RUNS = {"strict": {}, "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"},
        "compiled": {"COMPILE": "1"}}
# products whose tpu program is the very kernel CPU torch runs, so equal to the bit
EXACT = ("mm", "matmul_broadcast", "einsum_middle", "sdpa")


def _close(got, want, tol):
    return all(abs(a - b) <= tol * max(1.0, abs(b)) for a, b in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def cpu_result():
    return run_single(SCRIPT, {"FORCE_CPU": "1"}, timeout=300)[0]


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["aten", "xla"])
@pytest.mark.parametrize("run", list(RUNS))
def test_bf16_autocast_training_matches_cpu(run, kernels, cpu_result, tmp_path):
    env = {**RUNS[run], "TORCH_TPU_CPU_ATEN_KERNELS": "1" if kernels == "aten" else "0"}
    got, out = run_single(swap_cuda(SCRIPT, tmp_path / "bf16_tpu.py"), env, timeout=300)
    assert _close(got["losses"], cpu_result["losses"], 5e-3), (got["losses"], cpu_result["losses"])
    for name, want in cpu_result["products"].items():
        exact = kernels == "aten" and name in EXACT
        assert _close(got["products"][name], want, 0.0 if exact else 2e-2), name
    counters = got["counters"]
    if kernels == "xla":
        assert counters == {}, counters
    else:  # training's products and attention both ways, and the bare products
        for name in ("cpu_kernels.dot", "cpu_kernels.attention", "cpu_kernels.attention_backward"):
            assert counters.get(name, 0) >= 1, counters


def _ints(shape, seed):
    """bf16 integers in [-4, 4]: every product and sum is exact in float32, so any order of
    summation gives the same bits."""
    return jnp.asarray(np.random.default_rng(seed).integers(-4, 5, shape), jnp.bfloat16)


# (lhs shape, rhs shape, ((lhs contracting, rhs contracting), (lhs batch, rhs batch)))
LAYOUTS = [
    ((7, 5), (5, 3), (((1,), (0,)), ((), ()))),               # mm
    ((5, 7), (5, 3), (((0,), (0,)), ((), ()))),               # lhs transposed
    ((7, 5), (3, 5), (((1,), (1,)), ((), ()))),               # rhs transposed (a @ b.T)
    ((2, 7, 5), (2, 5, 3), (((2,), (1,)), ((0,), (0,)))),     # bmm
    ((7, 2, 5), (3, 5, 2), (((2,), (1,)), ((1,), (2,)))),     # batch dims in the middle / last
    ((2, 3, 4, 5), (4, 5, 6), (((2, 3), (0, 1)), ((), ()))),  # two contracting dims
    ((2, 3, 7, 5), (3, 2, 5, 4), (((3,), (2,)), ((0, 1), (1, 0)))),  # two batch dims, swapped
    ((6,), (6, 4), (((0,), (0,)), ((), ()))),                 # vector @ matrix
    ((6,), (6,), (((0,), (0,)), ((), ()))),                   # dot of vectors
]


@pytest.mark.parametrize("lhs_shape, rhs_shape, dims", LAYOUTS)
def test_dot_handler_equals_xla_dot(lhs_shape, rhs_shape, dims):
    lhs, rhs = _ints(lhs_shape, 0), _ints(rhs_shape, 1)
    aten = jax.jit(lambda a, b: lax.dot_general(a, b, dims))
    xla = jax.jit(lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
                  .astype(jnp.bfloat16))
    assert _cpu_kernels.TARGETS["dot"] in aten.lower(lhs, rhs).as_text()
    assert _cpu_kernels.TARGETS["dot"] not in xla.lower(lhs, rhs).as_text()
    np.testing.assert_array_equal(np.asarray(aten(lhs, rhs), np.float32),
                                  np.asarray(xla(lhs, rhs), np.float32))


def test_dot_handler_under_jax_transforms():
    """The custom call replaces the dot at lowering, after jax's transforms: the gradient's
    transposed products and a vmapped product take it too, and equal XLA's."""
    a, b = _ints((3, 6, 5), 2), _ints((5, 4), 3)

    def loss(a, b, acc=None):
        prod = (jnp.matmul(a, b) if acc is None
                else jnp.matmul(a, b, preferred_element_type=acc).astype(jnp.bfloat16))
        return (prod.astype(jnp.float32) ** 2).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))
    want = jax.jit(jax.grad(lambda a, b: loss(a, b, jnp.float32), argnums=(0, 1)))
    assert grads.lower(a, b).as_text().count(_cpu_kernels.TARGETS["dot"]) == 3
    for g, w in zip(grads(a, b), want(a, b)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    per_row = jax.jit(jax.vmap(jnp.matmul, in_axes=(0, None)))
    np.testing.assert_array_equal(np.asarray(per_row(a, b), np.float32),
                                  np.asarray(jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))))


def test_float32_and_empty_products_keep_xla():
    f32 = jax.jit(lambda a, b: a @ b).lower(jnp.ones((4, 3)), jnp.ones((3, 2))).as_text()
    empty = jax.jit(lambda a, b: a @ b).lower(jnp.ones((0, 3), jnp.bfloat16),
                                             jnp.ones((3, 2), jnp.bfloat16)).as_text()
    assert _cpu_kernels.TARGETS["dot"] not in f32 and _cpu_kernels.TARGETS["dot"] not in empty
