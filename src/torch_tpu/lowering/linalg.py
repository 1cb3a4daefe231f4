"""Matrix products and linear-algebra decompositions.

Products accumulate like torch's CPU and CUDA kernels: bfloat16/float16 operands multiply
into float32 (`preferred_element_type`) and round once at the end, and float32 products
use the precision in force (`_precision.for_matmul`: `torch.set_float32_matmul_precision`,
"highest" by default, i.e. true fp32 products; on TPU "medium" is the one-pass bf16 MXU
product). Every lowering that multiplies is marked `@precision.sensitive`, so its
programs are keyed by the setting. XLA:CPU ignores the precision, so it only changes the
values on accelerators.

Decompositions return what torch's LAPACK-backed kernels return: LU factors packed with
1-based int32 pivots (torch's backward formulas feed them to `linalg_lu_solve`), `info`
as the 1-based index of the first zero pivot / failed minor, and empty tensors for the
outputs a flag turns off. `check_errors=True` cannot raise from inside a compiled XLA
computation, so the `_ex` ops report failures only through `info`; the public functions
(linalg.inv, linalg.cholesky, linalg.solve, ...) still raise torch's errors, because torch
checks `info` in a separate `_linalg_check_errors` call.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .. import _cpu_kernels
from .. import _precision as precision
from ._dtypes import (
    cast_operands,
    cpp_type_name,
    result_dtype,
    round_to,
    scalar_type_name,
)
from .registry import aten, lowering

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


# ---------------------------------------------------------------- products
def _acc_dtype(x):
    return jnp.float32 if x.dtype in _LOW_PRECISION else x.dtype


def _matmul(a, b):
    """a @ b (with numpy batching), accumulated and returned in torch's accumulation dtype."""
    return jnp.matmul(a, b, precision=precision.for_matmul(a.dtype),
                      preferred_element_type=_acc_dtype(a))


def _refuse(message):
    raise RuntimeError(message)


def _check_product(a, b):
    """torch's products take operands of one dtype: CPU's and CUDA's kernels refuse
    float @ long, and torch's Python meta kernels of mm, mv and dot do not check (so the
    lowering does, with CPU's wording for each product)."""
    if a.dtype == b.dtype:
        return
    s, t = scalar_type_name(a.dtype), scalar_type_name(b.dtype)
    if a.ndim == 1 and b.ndim == 1:
        _refuse(f"dot : expected both vectors to have same dtype, but found {s} and {t}")
    if b.ndim == 1:
        _refuse(f"addmv input tensors must have the same dtype, but got {t}, {s}, and {t}")
    if a.ndim == 3:
        _refuse(f"expected scalar type {s} but found {t}")
    _refuse(f"expected m1 and m2 to have the same dtype, but got: {cpp_type_name(a.dtype)} != "
            f"{cpp_type_name(b.dtype)}")


def _check_scaled_product(self, m1, m2):
    """addmm, addbmm, baddbmm, addmv: `self` and both factors of one dtype (CPU's wording)."""
    if self.dtype == m1.dtype == m2.dtype:
        return
    names = [scalar_type_name(x.dtype) for x in (self, m1, m2)]
    if m2.ndim == 1:
        _refuse("addmv input tensors must have the same dtype, but got {}, {}, and {}".format(*names))
    if m1.ndim == 3 and self.ndim == 3:
        _refuse("Input dtypes must be the same, got: input {}, batch1: {}, batch2: {}".format(
            *[cpp_type_name(x.dtype) for x in (self, m1, m2)]))
    if self.dtype != m2.dtype:
        _refuse(f"self and mat2 must have the same dtype, but got {names[0]} and {names[2]}")
    _refuse(f"mat1 and mat2 must have the same dtype, but got {names[1]} and {names[2]}")


def _scaled_add(self, product, beta, alpha):
    """beta * self + alpha * product. torch converts beta and alpha to the computation
    type first (so for integer tensors beta=0.5 is 0) and ignores `self` when beta == 0
    (its NaN and inf do not propagate); beta is a Scalar and may be traced, hence the
    select instead of a Python branch."""
    self = self.astype(product.dtype)
    beta = jnp.asarray(beta).astype(product.dtype)
    alpha = jnp.asarray(alpha).astype(product.dtype)
    scaled_self = jnp.where(beta == 0, jnp.zeros_like(self), self * beta)
    return scaled_self + product * alpha


@lowering(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default)
@precision.sensitive
def _mm(self, other):
    _check_product(self, other)
    if _cpu_kernels.wants_rounded_product(self.dtype):  # the same rounding, ATen's kernel
        return jnp.matmul(self, other, preferred_element_type=self.dtype)
    return _matmul(self, other)


@lowering(aten.mm.dtype, aten.bmm.dtype)
@precision.sensitive
def _mm_out_dtype(self, mat2, out_dtype):
    # the executor casts the float32 accumulation to out_dtype
    _check_product(self, mat2)
    return _matmul(self, mat2)


@lowering(aten.vdot.default)
@precision.sensitive
def _vdot(self, other):
    _check_product(self, other)
    return _matmul(jnp.conj(self), other)


@lowering(aten._int_mm.default)
def _int_mm(self, mat2):
    return jnp.matmul(self, mat2, preferred_element_type=jnp.int32)


@lowering(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
@precision.sensitive
def _addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _check_scaled_product(self, mat1, mat2)
    return _scaled_add(self, _matmul(mat1, mat2), beta, alpha)


@lowering(aten.addmm.dtype, aten.baddbmm.dtype)
@precision.sensitive
def _addmm_out_dtype(self, mat1, mat2, out_dtype, *, beta=1, alpha=1):
    _check_product(mat1, mat2)  # self may be of out_dtype
    return _scaled_add(self, _matmul(mat1, mat2), beta, alpha)


@lowering(aten.addbmm.default)
@precision.sensitive
def _addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    # the batch sum is part of the contraction, so it accumulates in float32 too
    _check_scaled_product(self, batch1, batch2)
    product = jnp.einsum("bij,bjk->ik", batch1, batch2, precision=precision.for_matmul(batch1.dtype),
                         preferred_element_type=_acc_dtype(batch1))
    return _scaled_add(self, product, beta, alpha)


@lowering(aten.addr.default)
def _addr(self, vec1, vec2, *, beta=1, alpha=1):
    product = vec1.astype(_acc_dtype(vec1))[:, None] * vec2.astype(_acc_dtype(vec2))[None, :]
    return _scaled_add(self, product, beta, alpha)


@lowering(aten._addmm_activation.default)
@precision.sensitive
def _addmm_activation(self, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    _check_scaled_product(self, mat1, mat2)
    out = _scaled_add(self, _matmul(mat1, mat2), beta, alpha)
    # torch's CPU kernel applies the exact (erf) GELU
    return jax.nn.gelu(out, approximate=False) if use_gelu else jax.nn.relu(out)


@lowering(aten.trace.default)
def _trace(self):
    acc = jnp.int64 if not jnp.issubdtype(self.dtype, jnp.inexact) else _acc_dtype(self)
    return jnp.trace(self.astype(acc))


@lowering(aten.linalg_cross.default)
def _linalg_cross(self, other, *, dim=-1):
    """Broadcasting cross product along `dim`. torch's kernel computes a1*b2 - a2*b1 in
    the tensors' dtype, so 16-bit floats round each product before the difference."""
    dt = result_dtype(self, other)
    a, b = cast_operands(self, other)
    a, b = jnp.broadcast_arrays(a, b)
    a, b = jnp.moveaxis(a, dim, -1), jnp.moveaxis(b, dim, -1)

    def term(i, j):
        return round_to(a[..., i] * b[..., j], dt) - round_to(a[..., j] * b[..., i], dt)

    out = jnp.stack([term(1, 2), term(2, 0), term(0, 1)], axis=-1)
    return jnp.moveaxis(out, -1, dim)


# ---------------------------------------------------------------- helpers
def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x))


def _empty(dtype):
    """An output a flag turned off (torch returns an empty tensor there)."""
    return jnp.zeros((0,), dtype)


def _broadcast_batch(a, b):
    """Broadcast the batch dims (all but the last two) of two matrix stacks."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _tri_solve(a, b, *, lower, left=True, transpose=False, conjugate=False, unit=False):
    """Solve op(a) x = b (left) or x op(a) = b (right) for triangular a, where op is the
    optional transpose/conjugate. Batch dims broadcast like torch's."""
    a, b = _broadcast_batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=transpose,
                                       conjugate_a=conjugate, unit_diagonal=unit)


def _lu(a):
    """LU with partial pivoting -> (packed LU, 0-based row permutation, torch's pivots
    (1-based int32 swap sequence), info = 1 + index of the first zero on U's diagonal,
    0 when there is none, as LAPACK's getrf reports)."""
    lu, pivots, perm = lax.linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, perm, pivots.astype(jnp.int32) + 1, _first_index_plus_one(diag == 0)


def _first_index_plus_one(flags):
    """1 + the index of the first True along the last axis, 0 when none (int32)."""
    if flags.shape[-1] == 0:
        return jnp.zeros(flags.shape[:-1], jnp.int32)
    first = jnp.argmax(flags, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(flags, axis=-1), first, 0)


def _permute_rows(x, perm):
    """x[..., perm, :] with perm broadcast over x's batch dims."""
    perm = jnp.broadcast_to(perm, x.shape[:-2] + perm.shape[-1:])
    return jnp.take_along_axis(x, perm[..., :, None], axis=-2)


def _unpermute_rows(x, perm):
    """y with y[..., perm, :] = x: the inverse of _permute_rows."""
    return _permute_rows(x, jnp.argsort(perm, axis=-1))


def _lu_solve(lu, perm, b, *, left=True, adjoint=False):
    """Solve A x = b (or A^H x = b, or x A = b, x A^H = b) given A[perm] = L U."""
    if not left:
        # x A = b  <=>  A^H x^H = b^H ; x A^H = b <=> A x^H = b^H
        return _mH(_lu_solve(lu, perm, _mH(b), left=True, adjoint=not adjoint))
    lu, b = _broadcast_batch(lu, b)
    if not adjoint:
        y = _tri_solve(lu, _permute_rows(b, perm), lower=True, unit=True)
        return _tri_solve(lu, y, lower=False)
    # A^H = U^H L^H P^T
    y = _tri_solve(lu, b, lower=False, transpose=True, conjugate=True)
    y = _tri_solve(lu, y, lower=True, unit=True, transpose=True, conjugate=True)
    return _unpermute_rows(y, perm)


def _pivots_to_perm(pivots, n):
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, n)


def _eye_like(a):
    n = a.shape[-1]
    return jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)


# ---------------------------------------------------------------- LU family
@lowering(aten.linalg_lu_factor_ex.default)
def _linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg.lu_factor: LU without pivoting is not implemented on tpu")
    lu, _, pivots, info = _lu(A)
    return lu, pivots, info


def _unpack(lu, perm, m, n):
    """Packed LU and its row permutation -> (P, L, U) with A = P @ L @ U."""
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    P = (perm[..., None, :] == jnp.arange(m)[:, None]).astype(lu.dtype)
    return P, L, U


@lowering(aten.linalg_lu.default)
def _linalg_lu(A, *, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg.lu: LU without pivoting is not implemented on tpu")
    lu, perm, _, _ = _lu(A)
    return _unpack(lu, perm, A.shape[-2], A.shape[-1])


@lowering(aten.lu_unpack.default)
def _lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    perm = _pivots_to_perm(LU_pivots, m)
    P, L, U = _unpack(LU_data, perm, m, n)
    if not unpack_data:
        L, U = _empty(LU_data.dtype), _empty(LU_data.dtype)
    if not unpack_pivots:
        P = _empty(LU_data.dtype)
    return P, L, U


@lowering(aten.linalg_lu_solve.default)
def _linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    return _lu_solve(LU, _pivots_to_perm(pivots, LU.shape[-1]), B, left=left, adjoint=adjoint)


def _is_vector_rhs(A, B):
    """torch's linalg_solve_is_vector_rhs: B is a (batch of) vector(s)."""
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lowering(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    lu, perm, pivots, info = _lu(A)
    vector = _is_vector_rhs(A, B)
    rhs = B[..., :, None] if vector and left else B[..., None, :] if vector else B
    x = _lu_solve(lu, perm, rhs, left=left)
    if vector:
        x = x[..., :, 0] if left else x[..., 0, :]
    return x, lu, pivots, info


@lowering(aten.linalg_inv_ex.default)
def _linalg_inv_ex(A, *, check_errors=False):
    lu, perm, _, info = _lu(A)
    return _lu_solve(lu, perm, _eye_like(A)), info


def _det_lu(A):
    """LU for det/slogdet. torch factors A^T for real inputs (its kernels see a contiguous
    A, and det A^T = det A), and its backward solves with that factor accordingly, so the
    LU we return must be the same factorization."""
    return _lu(A if jnp.iscomplexobj(A) else _mT(A))


def _perm_sign(pivots, dtype):
    n = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, n + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1).astype(dtype)


@lowering(aten._linalg_det.default)
def _linalg_det(A):
    lu, _, pivots, _ = _det_lu(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return jnp.prod(diag, axis=-1) * _perm_sign(pivots, A.dtype), lu, pivots


@lowering(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    lu, _, pivots, _ = _det_lu(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    absdiag = jnp.abs(diag)
    unit = jnp.where(absdiag == 0, jnp.zeros_like(diag), diag / jnp.where(absdiag == 0, 1, absdiag))
    sign = jnp.prod(unit, axis=-1) * _perm_sign(pivots, A.dtype)
    return sign, jnp.sum(jnp.log(absdiag), axis=-1), lu, pivots


# ---------------------------------------------------------------- triangular solves
@lowering(aten.triangular_solve.default)
def _triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    x = _tri_solve(A, self, lower=not upper, transpose=transpose, unit=unitriangular)
    return x, A


@lowering(aten.linalg_solve_triangular.default)
def _linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    return _tri_solve(self, B, lower=not upper, left=left, unit=unitriangular)


# ---------------------------------------------------------------- Cholesky
def _cholesky(A):
    """Lower Cholesky factor reading A's lower triangle, as LAPACK potrf('L') does.
    XLA marks a matrix that is not positive-definite with NaN in the factor (XLA:CPU
    fills all of it), so info is nonzero exactly on failure but may name an earlier
    minor than LAPACK's order."""
    L = lax.linalg.cholesky(A, symmetrize_input=False)
    diag = jnp.diagonal(L, axis1=-2, axis2=-1)
    return L, _first_index_plus_one(jnp.isnan(diag))


@lowering(aten.linalg_cholesky_ex.default)
def _linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    L, info = _cholesky(self)
    return (_mH(L) if upper else L), info


@lowering(aten.cholesky.default)
def _cholesky_op(self, upper=False):
    L, _ = _cholesky(self)
    return _mH(L) if upper else L


def _cholesky_solve(b, factor, upper):
    """Solve (L L^H) x = b given L, or (U^H U) x = b given U."""
    y = _tri_solve(factor, b, lower=not upper, transpose=upper, conjugate=upper)
    return _tri_solve(factor, y, lower=not upper, transpose=not upper, conjugate=not upper)


@lowering(aten._cholesky_solve_helper.default)
def _cholesky_solve_helper(self, A, upper):
    return _cholesky_solve(self, A, upper)


@lowering(aten.cholesky_inverse.default)
def _cholesky_inverse(self, upper=False):
    return _cholesky_solve(_eye_like(self), self, upper)


# ---------------------------------------------------------------- spectral and QR
@lowering(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return _empty(A.dtype), jnp.linalg.svd(A, compute_uv=False), _empty(A.dtype)
    return jnp.linalg.svd(A, full_matrices=full_matrices)


@lowering(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    # torch reads only the UPLO triangle; symmetrize_input=False keeps that contract
    w, v = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else _empty(A.dtype))


@lowering(aten.linalg_qr.default)
def _linalg_qr(A, mode="reduced"):
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    return jnp.linalg.qr(A, mode=mode)


@lowering(aten.linalg_eig.default)
def _linalg_eig(self):
    # LAPACK's geev, as torch's CPU kernel; JAX implements it on XLA:CPU only
    return jnp.linalg.eig(self)


@lowering(aten._linalg_eigvals.default)
def _linalg_eigvals(self):
    return jnp.linalg.eigvals(self)


@lowering(aten.geqrf.default)
def _geqrf(self):
    """LAPACK's packed QR: R on and above the diagonal, the Householder vectors below it
    (numpy's "raw" mode returns the same, transposed)."""
    h, tau = jnp.linalg.qr(self, mode="raw")
    return _mT(h), tau


@lowering(aten.linalg_householder_product.default)
def _linalg_householder_product(input, tau):
    return lax.linalg.householder_product(input, tau)


@lowering(aten.ormqr.default)
def _ormqr(self, input2, input3, left=True, transpose=False):
    # transpose means the conjugate transpose for complex input, in both libraries
    return lax.linalg.ormqr(self, input2, input3, left=left, transpose=transpose)


@lowering(aten.linalg_lstsq.default)
@precision.sensitive
def _linalg_lstsq(self, b, rcond=None, *, driver=None):
    """The minimum-norm least-squares solution through the SVD (what every LAPACK driver
    returns for full-rank input, and gelsy/gelsd/gelss also for rank-deficient input),
    with the extra outputs torch's CPU `driver` fills (default gelsy): rank for all but
    gels, singular values for gelsd/gelss, and residuals when m > n for gels, or for
    gelsd/gelss when every matrix has full rank. That last rule makes the shape depend on
    the values, so such calls run eagerly."""
    driver = driver or "gelsy"
    vector = b.ndim == self.ndim - 1
    if vector:
        b = b[..., None]
    m, n = self.shape[-2:]
    batch = jnp.broadcast_shapes(self.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(self, batch + (m, n))
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    real = jnp.finfo(a.dtype).dtype
    if rcond is None:
        rcond = jnp.finfo(real).eps * max(m, n)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    keep = s > rcond * s[..., :1]
    s_inv = jnp.where(keep, 1 / s, 0).astype(a.dtype)
    x = _matmul(_mH(vh), s_inv[..., :, None] * _matmul(_mH(u), b))
    rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    svd_driver = driver in ("gelsd", "gelss")
    residuals = _empty(real)
    if m > n and (driver == "gels" or (svd_driver and bool(jnp.all(rank == n)))):
        residuals = jnp.sum(jnp.abs(_matmul(a, x) - b) ** 2, axis=-2)
    return (x[..., 0] if vector else x, residuals,
            _empty(jnp.int64) if driver == "gels" else rank,
            s if svd_driver else _empty(real))


@lowering(aten.linalg_matrix_exp.default)
def _linalg_matrix_exp(self):
    if self.dtype in (jnp.bfloat16, jnp.float16):  # expm takes float32 and wider
        return jax.scipy.linalg.expm(self.astype(jnp.float32)).astype(self.dtype)
    return jax.scipy.linalg.expm(self)


@lowering(aten.linalg_pinv.atol_rtol_tensor)
@precision.sensitive
def _linalg_pinv(self, *, atol=None, rtol=None, hermitian=False):
    """torch's rule: singular values at or below max(atol, rtol * largest) count as zero;
    rtol defaults to eps * max(m, n), or to 0 when only atol is given (and positive)."""
    real = jnp.finfo(self.dtype).dtype
    default_rtol = jnp.asarray(jnp.finfo(real).eps * max(self.shape[-2:]), real)
    atol_ = jnp.zeros((), real) if atol is None else atol.astype(real)
    if rtol is not None:
        rtol_ = rtol.astype(real)
    elif atol is not None:
        rtol_ = jnp.where(atol > 0, 0, default_rtol)
    else:
        rtol_ = default_rtol
    if hermitian:
        s, u = jnp.linalg.eigh(self, symmetrize_input=False)  # torch reads the lower triangle
        mag = jnp.abs(s)
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * jnp.max(mag, -1, keepdims=True, initial=0))
        s_inv = jnp.where(mag > tol, 1 / s, 0).astype(self.dtype)
        return _matmul(u * s_inv[..., None, :], _mH(u))
    u, s, vh = jnp.linalg.svd(self, full_matrices=False)
    tol = jnp.maximum(atol_[..., None], rtol_[..., None] * s[..., :1])
    s_inv = jnp.where(s > tol, 1 / s, 0).astype(self.dtype)
    return _matmul(_mH(vh) * s_inv[..., None, :], _mH(u))
