"""Index bounds: which arguments of an indexing lowering are indices, and where they must lie.

XLA never faults on a bad index: a gather clamps it, a scatter drops it, `jnp.take` fills
NaN. CPU raises, and CUDA's kernels assert on the device. A lowering therefore declares its
index arguments beside its rule, `@registry.index_bounds(spec)`, where `spec(vals)` takes
the op's argument values in schema order and returns one `Bound` per index argument. A
spec reads only ranks, shapes and dtypes, so one declaration serves both checkers:

  - Debug (eager/debug.py) reads the index values on the host before the op runs and
    raises at the call, naming the value and its position;
  - Strict and DeferAndFuse (op/asserts.py) add one validity code to the op's own XLA
    program, computed from the traced index arrays, and raise at the next
    synchronization: CUDA's device-side asserts.

The helpers below are the index shapes torch's ops share. A spec's bounds come in a fixed
order for a given call signature (the assert's code names the first bound that failed).
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Bound(NamedTuple):
    """One index argument: valid values lie in [0, size), or [-size, size) where negative
    indices wrap (`negative_ok`); `ignore` is one value let through (nll_loss's
    ignore_index). `within` says what the size is, for messages."""

    arg: str
    index: Any            # a torch tensor (Debug) or a JAX array (inside a program)
    size: int
    within: str
    negative_ok: bool = False
    ignore: Any = None
    noun: str = "index"

    def describe(self) -> str:
        lo = -self.size if self.negative_ok else 0
        text = f"argument '{self.arg}': {self.noun} outside [{lo}, {self.size}) for {self.within}"
        return text + (f" (except {self.ignore})" if self.ignore is not None else "")


def is_mask(index) -> bool:
    """A boolean (or the deprecated uint8) index: it selects, it does not address. Works on
    torch dtypes (`torch.bool`) and JAX ones (`bool`) alike."""
    return index is not None and str(index.dtype).rsplit(".", 1)[-1] in ("bool", "uint8")


def dim_bound(arg, index, t, dim, negative_ok=False) -> Bound:
    """`index` addresses dimension `dim` of `t` (a 0-dim `t` counts as one element)."""
    if t.ndim == 0:
        dim, size = 0, 1
    else:
        dim = dim + t.ndim if dim < 0 else dim
        size = t.shape[dim]
    return Bound(arg, index, size, f"dimension {dim} with size {size}", negative_ok)


def along_dim(negative_ok=False):
    """(self, dim, index, ...) ops: gather, scatter*, index_select/add/copy/fill/reduce."""
    return lambda v: [dim_bound("index", v[2], v[0], v[1], negative_ok)]


def advanced(vals):
    """(self, indices, ...): index and index_put. One index per dim, negative ones wrap; a
    boolean mask covers as many dims as it has and is not an address."""
    self, out, dim = vals[0], [], 0
    for i, idx in enumerate(vals[1]):
        if idx is None:
            dim += 1
        elif is_mask(idx):
            dim += idx.ndim
        else:
            if dim < self.ndim:
                out.append(dim_bound(f"indices[{i}]", idx, self, dim, True))
            dim += 1
    return out


def flat(vals):
    """(self, index, ...): take and put address self's elements in row-major order."""
    n = 1
    for s in vals[0].shape:
        n *= s
    return [Bound("index", vals[1], n, f"a tensor of {n} elements", True)]


def rows(weight_i, indices_i, rows_i=None):
    """Embedding-style ops: `indices` pick rows of `weight` (or of a table whose row count
    is argument `rows_i`, in a backward); negative ones are errors."""
    def spec(vals):
        n = vals[rows_i] if rows_i is not None else vals[weight_i].shape[0]
        return [Bound("indices", vals[indices_i], n, f"dimension 0 with size {n}")]
    return spec


def classes(self_i, target_i, ignore_i=None, class_dim=None):
    """Class-index targets (nll_loss, multi_margin_loss): valid in [0, C), C the size of
    self's class dim (dim 0 of a vector, else `class_dim`, default 1); `ignore_i` is the
    argument holding the ignored target value."""
    def spec(vals):
        x = vals[self_i]
        dim = 0 if x.ndim == 1 else (class_dim if class_dim is not None else 1)
        dim = dim + x.ndim if dim < 0 else dim
        c = x.shape[dim] if x.ndim else 1  # a 0-dim input is one class (multi_margin_loss)
        ignore = vals[ignore_i] if ignore_i is not None else None
        return [Bound("target", vals[target_i], c, f"{c} classes", ignore=ignore, noun="target")]
    return spec


def unpool(vals):
    """max_unpool: each index addresses one output plane of prod(output_size) elements."""
    plane = 1
    for s in vals[2]:
        plane *= s
    return [Bound("indices", vals[1], plane, f"an output plane of {plane} elements")]
