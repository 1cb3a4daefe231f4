"""The pending graph of DeferAndFuse: nodes and the lazy values they will produce."""
from __future__ import annotations


class Lazy:
    """A flat buffer that a pending node will produce: output `idx` of `node`."""

    __slots__ = ("node", "idx", "owner")

    def __init__(self, node, idx, owner):
        self.node = node
        self.idx = idx
        self.owner = owner  # weakref to the storage object that holds this value


class Node:
    __slots__ = ("entry", "bufs", "dyns", "outs", "frame", "pos")

    def __init__(self, entry, bufs, dyns, frame):
        self.entry = entry
        self.bufs = bufs      # jax arrays or Lazy values, in the entry's input order
        self.dyns = dyns      # dynamic scalars (learning rates, RNG seed/offset)
        self.outs = []        # Lazy per output
        self.frame = frame    # (file, line) of the user code that recorded it, for errors
        self.pos = 0
