"""torch's fused optimizer steps (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`,
`_fused_adagrad_`), each one program over the whole parameter list.

torch.optim's Adam, AdamW, SGD and Adagrad with fused=True call one of these per (device,
dtype) group, and HF Trainer's default optimizer (adamw_torch_fused) is one of them. The
in-place overloads and their tensor-lr twins reach the functional ones lowered here by the
registry's rule; a compiled graph that calls them holds the functional ones directly.

Each element goes through the foreach path's sequence of ops (torch/optim/adam.py
`_multi_tensor_adam`, sgd.py `_multi_tensor_sgd`, adagrad.py `_multi_tensor_adagrad`),
computed by the same elementwise lowerings, so fused=True and foreach=True agree to the bit
or within 1 ulp. torch's CUDA kernel (cuda/fused_adam_utils.cuh) writes the same math in
another order (a hand-written lerp, `param -= lr * wd * param`), which differs from foreach
by an ulp here and there;
matching foreach keeps switching between the two a no-op. The hyperparameter arithmetic
(bias corrections, `1 - lr * wd`, `-lr`) is done in float64, as the foreach path does it
on Python floats, from the float32 step counts the optimizer keeps; those floats are
traced arguments (`traced_floats`), so a schedule's new lr reuses the program. Each op's
result is kept rounded as that op stores it (`_stored`): XLA would otherwise fuse a
product into the add after it. What follows torch's fused kernels rather than foreach:
  - 16-bit tensors are computed in float32 from load to store (foreach rounds after
    every op);
  - GradScaler's inputs: grads are divided by `grad_scale` and that unscaled grad is
    written back (only when `grad_scale` is given), and `found_inf == 1` leaves every
    tensor as it was.
"""
from __future__ import annotations

import jax.numpy as jnp

from .. import _jax_internals
from . import pointwise  # noqa: F401  (registers the element ops used below)
from ._dtypes import to_opmath
from .registry import LOWERINGS, aten, lowering, traced_floats


def _stored(x):
    """`x` rounded as a foreach op's result is when it is stored. Inside one program XLA
    contracts a product and the add that consumes it into one FMA (XLA:CPU always allows
    it, and it turns a division by a scalar into a product first), which rounds once where
    the foreach path, whose ops are separate programs, rounds twice. XLA drops optimization
    barriers and no-op reduce_precision before codegen; a select on the value's NaN-ness is
    an identity that neither XLA nor LLVM folds, so each op's result stays a value."""
    return jnp.where(x != x, jnp.nan, x)


def _loaded(x):
    """A tensor argument as the foreach ops read it: a stored value in its opmath dtype.
    Under DeferAndFuse the grads may come from the same program (the backward), where XLA
    would contract their last product into the first add here."""
    return _stored(to_opmath(x))


def _op(op):
    """The elementwise lowering of `op`, its result kept as one foreach op would store it."""
    fn = LOWERINGS[op]
    return lambda *args, **kwargs: _stored(fn(*args, **kwargs))


_neg = _op(aten.neg.default)
_add = _op(aten.add.Tensor)
_mul = _op(aten.mul.Tensor)
_div = _op(aten.div.Tensor)
_sqrt = _op(aten.sqrt.default)
_maximum = _op(aten.maximum.default)
_lerp = _op(aten.lerp.Scalar)
_addcmul = _op(aten.addcmul.default)
_addcdiv = _op(aten.addcdiv.default)


def _number(x):
    """A hyperparameter as the foreach path computes with it: a Python float. It arrives as
    a traced scalar (eager), a constant (a compiled graph) or a 0-dim array (the tensor-lr
    overloads, a step count); weakly typed float64 is what the elementwise lowerings read
    as a Python number, which never promotes a tensor, not even a 0-dim parameter."""
    return _jax_internals.convert_element_type(jnp.asarray(x), jnp.dtype(jnp.float64),
                                               weak_type=True)


def _check_lengths(name, n, **lists):
    """torch's kernels check that each list holds `n` tensors (zip would drop the rest)."""
    for arg, xs in lists.items():
        if len(xs) != n:
            raise RuntimeError(f"{name}: expected {n} tensors in {arg}, got {len(xs)}")


def _unscale(grad, grad_scale):
    """GradScaler's unscaling (the kernels divide, where foreach's GradScaler multiplies by
    the reciprocal: the same for the power-of-two scales GradScaler keeps)."""
    return grad if grad_scale is None else _div(grad, grad_scale)


def _skip_if_inf(found_inf, old, new):
    """The values to store: `old` where GradScaler found an inf or NaN, as torch's kernels
    return without writing when `*found_inf == 1`."""
    if found_inf is None:
        return new
    skip = found_inf == 1
    return [[jnp.where(skip, o, n) for o, n in zip(os, ns)] for os, ns in zip(old, new)]


def _adam(decoupled: bool):
    name = "_fused_adamw" if decoupled else "_fused_adam"

    def lower(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
              beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        _check_lengths(name, len(self), grads=grads, exp_avgs=exp_avgs,
                       exp_avg_sqs=exp_avg_sqs, state_steps=state_steps)
        _check_lengths(name, len(self) if amsgrad else 0, max_exp_avg_sqs=max_exp_avg_sqs)
        lr, beta1, beta2, wd, eps = map(_number, (lr, beta1, beta2, weight_decay, eps))
        decay = wd != 0
        new = ([], [], [], [], [])
        for i, (p, g0, m, v, step) in enumerate(zip(self, grads, exp_avgs, exp_avg_sqs,
                                                    state_steps)):
            p, m, v = map(_loaded, (p, m, v))
            g = _unscale(_loaded(g0), grad_scale)
            new[1].append(g0 if grad_scale is None else g)
            if maximize:
                g = _neg(g)
            if decoupled:
                p = jnp.where(decay, _mul(p, 1 - lr * wd), p)
            else:
                g = jnp.where(decay, _add(g, p, alpha=wd), g)
            m = _lerp(m, g, 1 - beta1)
            v = _addcmul(_mul(v, beta2), g, g, value=1 - beta2)
            t = _number(step)
            step_size = (lr / (1 - beta1 ** t)) * -1
            bias_correction2_sqrt = (1 - beta2 ** t) ** 0.5
            if amsgrad:
                vmax = _maximum(_loaded(max_exp_avg_sqs[i]), v)
                new[4].append(vmax)
                denom = _sqrt(vmax)
            else:
                denom = _sqrt(v)
            denom = _add(_div(denom, bias_correction2_sqrt), eps)
            new[0].append(_addcdiv(p, m, denom, value=step_size))
            new[2].append(m)
            new[3].append(v)
        if not amsgrad:
            new[4].extend(max_exp_avg_sqs)
        old = (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
        return _skip_if_inf(found_inf, old, new)

    lower.__name__ = name
    return lower


def _sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov,
         maximize, is_first_step, grad_scale=None, found_inf=None):
    # torch passes no momentum buffers when momentum == 0, and garbage ones (empty_like) on
    # the first step, which is_first_step says to overwrite
    if momentum_buffer_list:
        _check_lengths("_fused_sgd", len(self), grads=grads,
                       momentum_buffer_list=momentum_buffer_list)
    wd, momentum, lr, dampening = map(_number, (weight_decay, momentum, lr, dampening))
    decay = wd != 0
    new = ([], [], [])
    for i, (p, g0) in enumerate(zip(self, grads)):
        p = _loaded(p)
        g = _unscale(_loaded(g0), grad_scale)
        new[1].append(g0 if grad_scale is None else g)
        if maximize:
            g = _neg(g)
        g = jnp.where(decay, _add(g, p, alpha=wd), g)
        if momentum_buffer_list:
            if is_first_step:
                buf = g
            else:
                buf = _add(_mul(_loaded(momentum_buffer_list[i]), momentum), g,
                           alpha=1 - dampening)
            new[2].append(buf)
            g = _add(g, buf, alpha=momentum) if nesterov else buf
        new[0].append(_add(p, g, alpha=-lr))
    return _skip_if_inf(found_inf, (self, grads, momentum_buffer_list), new)


def _adagrad(with_steps: bool):
    """`_fused_adagrad`; the float-lr overload also returns the step counts (which the
    optimizer itself advanced before the call), the tensor-lr one does not."""

    def lower(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
              maximize, grad_scale=None, found_inf=None):
        _check_lengths("_fused_adagrad", len(self), grads=grads, state_sums=state_sums,
                       state_steps=state_steps)
        lr, lr_decay, wd, eps = map(_number, (lr, lr_decay, weight_decay, eps))
        decay = wd != 0
        new = ([], [], [])
        for p, g0, total, step in zip(self, grads, state_sums, state_steps):
            p, total = _loaded(p), _loaded(total)
            g = _unscale(_loaded(g0), grad_scale)
            new[1].append(g0 if grad_scale is None else g)
            if maximize:
                g = _neg(g)
            g = jnp.where(decay, _add(g, p, alpha=wd), g)
            minus_clr = -lr / (1 + (_number(step) - 1) * lr_decay)
            total = _addcmul(total, g, g, value=1)
            std = _add(_sqrt(total), eps)
            new[0].append(_addcdiv(p, _mul(g, minus_clr), std))
            new[2].append(total)
        out = _skip_if_inf(found_inf, (self, grads, state_sums), new)
        return (*out, list(state_steps)) if with_steps else out

    lower.__name__ = "_fused_adagrad"
    return lower


def _functional(packet):
    """The overloads that compute values (default, tensor_lr); their out= twins derive."""
    return [getattr(packet, name) for name in packet.overloads() if not name.endswith("out")]


lowering(*_functional(aten._fused_adam))(traced_floats(_adam(decoupled=False)))
lowering(*_functional(aten._fused_adamw))(traced_floats(_adam(decoupled=True)))
lowering(*_functional(aten._fused_sgd))(traced_floats(_sgd))
lowering(aten._fused_adagrad.default)(traced_floats(_adagrad(with_steps=True)))
lowering(aten._fused_adagrad.tensor_lr)(traced_floats(_adagrad(with_steps=False)))
