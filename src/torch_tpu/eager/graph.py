"""The pending graph of DeferAndFuse: nodes and the lazy values they will produce.

Both types are C (csrc/graph.cpp), because every recorded op makes a Node and a Lazy per
result, and the flush walks them all:

`Node(entry, bufs, dyns, frame)`: one recorded op.
  entry  the op's cached opcall.Entry (its traceable body, result shapes and dtypes)
  bufs   input buffers: jax arrays or Lazy values, in the entry's input order
  dyns   dynamic scalars (learning rates, RNG seed and offset)
  outs   a Lazy per output
  frame  (file, line) of the user code that recorded it, for errors
  pos    its index in the graph, set at the flush

`Lazy(node, idx, owner)`: the flat buffer that output `idx` of `node` will be; `owner` is
a weakref to the storage object whose buffer record holds it.
"""
from __future__ import annotations

from .._C import Lazy, Node

__all__ = ["Lazy", "Node"]
