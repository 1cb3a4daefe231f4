"""GradScaler's two kernels: `_amp_foreach_non_finite_check_and_unscale` and
`_amp_update_scale`, each one program.

`torch.amp.GradScaler("tpu")` calls the first per (device, dtype) group of grads in
`unscale_` (and with inv_scale 1 to find infs for a fused optimizer), the second in
`update()`. Both follow torch's CPU and CUDA kernels (ATen native/cpu and
cuda/AmpKernels.cu): a grad is multiplied by `inv_scale` in its opmath dtype and stored
back in its own; `found_inf` is set to 1 when any element of any grad is not finite and
otherwise kept as it was (GradScaler passes in a zero); the scale backs off on an inf,
and grows every `growth_interval` clean steps unless that would overflow float32. The
in-place overloads GradScaler calls reach these functional ones by the registry's rule.
"""
from __future__ import annotations

import jax.numpy as jnp

from ._dtypes import to_opmath
from .registry import aten, lowering


def _check_one_element(name, what, x, dtype):
    # torch's kernels check these before touching data; their shapes and dtypes are
    # known while tracing, so the same errors come out here
    if x.size != 1:
        raise RuntimeError(f"{name}: {what} must be a 1-element tensor.")
    if x.dtype != dtype:
        raise RuntimeError(f"{name}: {what} must be a {jnp.dtype(dtype).name} tensor.")


@lowering(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_foreach_non_finite_check_and_unscale(self, found_inf, inv_scale):
    name = "_amp_foreach_non_finite_check_and_unscale_"
    _check_one_element(name, "found_inf", found_inf, jnp.float32)
    _check_one_element(name, "inv_scale", inv_scale, jnp.float32)
    out, any_inf = [], jnp.zeros((), jnp.bool_)
    for grad in self:
        if not jnp.issubdtype(grad.dtype, jnp.floating):
            raise RuntimeError(f"{name}: expected floating point tensors in self, "
                               f"got {grad.dtype}")
        val = to_opmath(grad)
        any_inf = any_inf | ~jnp.all(jnp.isfinite(val))
        out.append((val * inv_scale.reshape(()).astype(val.dtype)).astype(grad.dtype))
    return out, jnp.where(any_inf, jnp.ones_like(found_inf), found_inf)


@lowering(aten._amp_update_scale.default)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor,
                     scale_backoff_factor, growth_interval):
    name = "_amp_update_scale_"
    _check_one_element(name, "current_scale", self, jnp.float32)
    _check_one_element(name, "growth_tracker", growth_tracker, jnp.int32)
    _check_one_element(name, "found_inf", found_inf, jnp.float32)
    # the CPU kernel multiplies the float scale by the double factor and rounds once
    scale = self.astype(jnp.float64)
    backed_off = (scale * scale_backoff_factor).astype(jnp.float32)
    grown = (scale * scale_growth_factor).astype(jnp.float32)
    successful = growth_tracker + 1
    grow = successful == growth_interval
    clean_scale = jnp.where(grow & jnp.isfinite(grown), grown, self)
    clean_tracker = jnp.where(grow, jnp.zeros_like(growth_tracker), successful)
    inf = found_inf != 0
    return (jnp.where(inf, backed_off, clean_scale),
            jnp.where(inf, jnp.zeros_like(growth_tracker), clean_tracker))
