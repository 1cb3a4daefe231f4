"""A fused RMSNorm written as Pallas kernels and used from PyTorch with `torch_tpu.jax_op`.

The forward kernel normalizes a block of rows per grid step and also returns each row's
reciprocal RMS, which the backward kernel reuses; both are registered as torch ops, and the
backward is wired with `register_autograd`. The ops then run in every eager mode (fused
into DeferAndFuse's pending graph) and inside `torch.compile` graphs, like aten ops.

On a TPU the kernels compile with Mosaic; elsewhere (XLA:CPU has no Mosaic) Pallas runs
them in interpret mode, as here.

    python examples/pallas_rmsnorm.py
"""
import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

import torch_tpu

INTERPRET = jax.default_backend() != "tpu"
BLOCK_ROWS = 8


def _row_blocks(rows: int) -> int:
    return BLOCK_ROWS if rows % BLOCK_ROWS == 0 else rows


# ---------------------------------------------------------------- the kernels
def _forward_kernel(x_ref, w_ref, y_ref, rstd_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    y_ref[...] = (x * rstd * w_ref[...].astype(jnp.float32)).astype(y_ref.dtype)
    rstd_ref[...] = rstd


def _backward_kernel(g_ref, x_ref, w_ref, rstd_ref, dx_ref, dw_ref):
    x = x_ref[...].astype(jnp.float32)
    rstd = rstd_ref[...]
    x_hat = x * rstd
    g = g_ref[...].astype(jnp.float32)
    gw = g * w_ref[...].astype(jnp.float32)
    # d/dx of x * rstd(x): rstd * (gw - x_hat * mean(gw * x_hat))
    dx = rstd * (gw - x_hat * jnp.mean(gw * x_hat, axis=-1, keepdims=True))
    dx_ref[...] = dx.astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(g * x_hat, axis=0, keepdims=True)  # this block's share of dw


def _check(x, weight):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"rms_norm takes floating input, got {x.dtype}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm's weight must have shape {x.shape[-1:]} (the last dim of "
                         f"the input), got {weight.shape}")


def rms_norm_forward(x: jax.Array, weight: jax.Array,
                     eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    _check(x, weight)
    hidden = x.shape[-1]
    rows = x.size // hidden
    block = _row_blocks(rows)
    y, rstd = pl.pallas_call(
        functools.partial(_forward_kernel, eps=eps),
        grid=(rows // block,),
        in_specs=[pl.BlockSpec((block, hidden), lambda i: (i, 0)),
                  pl.BlockSpec((1, hidden), lambda i: (0, 0))],
        out_specs=[pl.BlockSpec((block, hidden), lambda i: (i, 0)),
                   pl.BlockSpec((block, 1), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, hidden), x.dtype),
                   jax.ShapeDtypeStruct((rows, 1), jnp.float32)],
        interpret=INTERPRET,
    )(x.reshape(rows, hidden), weight.reshape(1, hidden))
    return y.reshape(x.shape), rstd.reshape(x.shape[:-1])


def rms_norm_backward(grad: jax.Array, x: jax.Array, weight: jax.Array,
                      rstd: jax.Array) -> tuple[jax.Array, jax.Array]:
    hidden = x.shape[-1]
    rows = x.size // hidden
    block = _row_blocks(rows)
    dx, dw_blocks = pl.pallas_call(
        _backward_kernel,
        grid=(rows // block,),
        in_specs=[pl.BlockSpec((block, hidden), lambda i: (i, 0)),
                  pl.BlockSpec((block, hidden), lambda i: (i, 0)),
                  pl.BlockSpec((1, hidden), lambda i: (0, 0)),
                  pl.BlockSpec((block, 1), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((block, hidden), lambda i: (i, 0)),
                   pl.BlockSpec((1, hidden), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, hidden), x.dtype),
                   jax.ShapeDtypeStruct((rows // block, hidden), jnp.float32)],
        interpret=INTERPRET,
    )(grad.reshape(rows, hidden), x.reshape(rows, hidden), weight.reshape(1, hidden),
      rstd.reshape(rows, 1))
    return dx.reshape(x.shape), dw_blocks.sum(axis=0).astype(weight.dtype)


# ---------------------------------------------------------------- the torch ops
rms_norm_fwd = torch_tpu.jax_op("pallas_example::rms_norm_fwd", rms_norm_forward,
                                static_argnames=("eps",))
rms_norm_bwd = torch_tpu.jax_op("pallas_example::rms_norm_bwd", rms_norm_backward)


def _setup_context(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, grad_y, grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd(grad_y, x, weight, rstd)
    return dx, dw, None


rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return rms_norm_fwd(x, weight, eps)[0]


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rms_norm_composite(x, weight, eps=1e-6):
    """The same RMSNorm from PyTorch ops, for comparison."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(4, 16, 64, device="tpu", requires_grad=True)
    w = (1 + 0.1 * torch.randn(64, device="tpu")).requires_grad_()

    def grads(fn):
        x.grad = w.grad = None
        y = fn(x, w)
        (y * torch.linspace(-1, 1, 64, device="tpu")).sum().backward()
        return y.detach(), x.grad, w.grad

    want = grads(rms_norm_composite)
    for name, fn in [("eager", rms_norm), ("torch.compile", torch.compile(rms_norm))]:
        got = grads(fn)
        errs = [float((a - b).abs().max()) for a, b in zip(got, want)]
        print(f"{name:14s} max |diff| vs composite: y {errs[0]:.1e}  dx {errs[1]:.1e}  "
              f"dw {errs[2]:.1e}")
        assert max(errs) < 1e-4, errs
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), RMSNorm(64)).to("tpu")
    print("RMSNorm module output", tuple(model(x).shape), "on", model(x).device)
