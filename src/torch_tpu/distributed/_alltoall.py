"""all_to_all and all_to_all_single, even and uneven.

Even splits are one XLA all-to-all over the flat buffers (dim-0 chunks of a contiguous
tensor are flat chunks). Uneven splits first agree on the largest chunk any rank sends
(one small pmax, read on the host), then pad every chunk to that size (rounded up to a
power of two, so varying splits reuse a few programs), exchange evenly, and compact. The
row maps that pad and compact are built on the host and passed in, so the program does
not depend on the split pattern itself.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import _runtime, _storage
from . import _io


def _even(pg, output, flat_in_, dt):
    n = flat_in_.shape[0]
    ins = ((n, dt),)
    (flat,) = pg._issue(pg.mesh(), "all_to_all", [flat_in_], ins, ins)
    return flat


def all_to_all_single(pg, output, inp, out_splits, in_splits) -> None:
    w = pg.size()
    if output.dtype != inp.dtype:
        raise ValueError(f"tpu_dist all_to_all_single: input {inp.dtype} and output "
                         f"{output.dtype} differ")
    rows_in = inp.shape[0] if inp.dim() else 1
    rows_out = output.shape[0] if output.dim() else 1
    inner = math.prod(inp.shape[1:]) if inp.dim() > 1 else 1
    if math.prod(output.shape[1:] if output.dim() > 1 else ()) != inner:
        raise ValueError("tpu_dist all_to_all_single: input and output rows differ in size: "
                         f"{tuple(inp.shape)} vs {tuple(output.shape)}")
    if not in_splits:
        if rows_in % w:
            raise ValueError(f"tpu_dist all_to_all_single: {rows_in} rows do not split evenly "
                             f"over {w} ranks; pass input_split_sizes")
        in_splits = [rows_in // w] * w
    if not out_splits:
        if rows_out % w:
            raise ValueError(f"tpu_dist all_to_all_single: {rows_out} output rows do not split "
                             f"evenly over {w} ranks; pass output_split_sizes")
        out_splits = [rows_out // w] * w
    if len(in_splits) != w or len(out_splits) != w:
        raise ValueError(f"tpu_dist all_to_all_single: split sizes need {w} entries (the group "
                         f"size), got {len(in_splits)} and {len(out_splits)}")
    if sum(in_splits) != rows_in or sum(out_splits) != rows_out:
        raise ValueError(
            f"tpu_dist all_to_all_single: split sizes sum to {sum(in_splits)} and "
            f"{sum(out_splits)}, but the tensors have {rows_in} and {rows_out} rows")
    flat_in_, _ = _io.flat_in(inp)
    dt = _io.dtype_name(inp)
    if len(set(in_splits) | set(out_splits)) == 1:
        if inp.numel():
            _io.flat_out(output, _even(pg, output, flat_in_, dt))
        return
    flat = _uneven(pg, flat_in_, dt, in_splits, out_splits, inner, rows_in, rows_out)
    if flat is not None:
        _io.flat_out(output, flat)


def _agree_max(pg, value: int) -> int:
    """The largest `value` over the group (one tiny collective, read on the host)."""
    block = jax.device_put(np.array([value], np.int64), _runtime.device())
    ins = ((1, "int64"),)
    (out,) = pg._issue(pg.mesh(), "max", [block], ins, ins)
    return int(np.asarray(out)[0])


def _uneven(pg, flat_in_, dt, in_splits, out_splits, inner, rows_in, rows_out):
    w = pg.size()
    largest = _agree_max(pg, max(list(in_splits) + list(out_splits)))
    if largest == 0:
        return None
    pad = 1 << (largest - 1).bit_length()
    send = np.full((w, pad), rows_in, dtype=np.int32)  # rows_in = the appended zero row
    start = 0
    for j, s in enumerate(in_splits):
        send[j, :s] = np.arange(start, start + s)
        start += s
    recv = np.concatenate([j * pad + np.arange(s, dtype=np.int32)
                           for j, s in enumerate(out_splits)] or [np.zeros(0, np.int32)])
    if rows_out == 0:
        recv = np.zeros(1, np.int32)  # keep one row so the program has a non-empty output
    blocks = [flat_in_ if rows_in else _storage.zeros(inner, flat_in_.dtype),
              _io.to_numpy_index(send.reshape(-1)), _io.to_numpy_index(recv)]
    ins = ((blocks[0].shape[0], dt), (w * pad, "int32"), (recv.shape[0], "int32"))
    outs = ((recv.shape[0] * inner, dt),)
    sig = (((w * pad * inner, dt),), ())  # what every rank shares; the totals differ
    (flat,) = pg._issue(pg.mesh(), "all_to_all(uneven)", blocks, ins, outs,
                        extra=(pad, inner, recv.shape[0]), sig=sig)
    return flat if rows_out else None


def all_to_all_lists(pg, outputs, inputs) -> None:
    w = pg.size()
    if len(outputs) != w or len(inputs) != w:
        raise ValueError(f"tpu_dist all_to_all: expected {w} input and {w} output tensors, "
                         f"got {len(inputs)} and {len(outputs)}")
    dtypes = {t.dtype for t in list(outputs) + list(inputs)}
    if len(dtypes) != 1:
        raise ValueError(f"tpu_dist all_to_all: all tensors must share one dtype, got {dtypes}")
    in_sizes = [t.numel() for t in inputs]
    out_sizes = [t.numel() for t in outputs]
    dt = _io.dtype_name(inputs[0])
    flat_in_ = _concat([_io.flat_in(t)[0] for t in inputs])
    if len(set(in_sizes) | set(out_sizes)) == 1:
        if in_sizes[0] == 0:
            return
        flat = _even(pg, None, flat_in_, dt)
    else:
        flat = _uneven(pg, flat_in_, dt, in_sizes, out_sizes, 1, sum(in_sizes), sum(out_sizes))
        if flat is None:
            return
    for t, piece in zip(outputs, _io.split(flat, out_sizes)):
        if t.numel():
            _io.flat_out(t, piece)


def _concat(flats):
    return _concat_fn(len(flats))(*flats)


@functools.lru_cache(maxsize=64)
def _concat_fn(k):
    return jax.jit(lambda *xs: jnp.concatenate(xs))
