"""``RadialEdges``: one forward pass's view of the edges for the radial primitives.

An encoder builds it once per forward from its edge lengths and hands it to every layer. The
radial basis and envelope values are computed on first use and shared by all layers (the stock
path), while a fused backend reads ``length`` and the ``basis`` / ``envelope`` modules and never
materialises them. Under activation checkpointing the encoder calls :meth:`materialize` first,
so a recomputed layer finds the same cached tensors it used the first time.
"""

from __future__ import annotations

import torch
from torch import nn


class RadialEdges:
    """Edges ``src -> dst`` with lengths, for message passing on ``num_nodes`` nodes.

    Args:
        src, dst: ``[E]`` int64 source and target node of each edge.
        length: ``[E]`` edge lengths (any float dtype; the basis is evaluated on it as given).
        num_nodes: N, a Python int (never read from a tensor: capture-safe).
        dtype: dtype of the node features; basis and envelope values are cast to it.
        basis: the radial basis module, ``[E] -> [E, R]``.
        envelope: the smooth cutoff module, ``[E] -> [E]``.
        unit: ``[E, 3]`` unit vectors (equivariant primitives), or None.
        attr: ``[E, A]`` edge inputs appended to the basis values, or None.
    """

    __slots__ = ("src", "dst", "length", "num_nodes", "dtype", "basis", "envelope", "unit", "attr", "_basis", "_env")

    def __init__(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        length: torch.Tensor,
        num_nodes: int,
        dtype: torch.dtype,
        basis: nn.Module,
        envelope: nn.Module,
        unit: torch.Tensor | None = None,
        attr: torch.Tensor | None = None,
    ) -> None:
        self.src, self.dst, self.length, self.num_nodes, self.dtype = src, dst, length, num_nodes, dtype
        self.basis, self.envelope, self.unit, self.attr = basis, envelope, unit, attr
        self._basis: torch.Tensor | None = None
        self._env: torch.Tensor | None = None

    @property
    def basis_values(self) -> torch.Tensor:
        """``[E, R (+A)]``: ``basis(length)`` in ``dtype``, with ``attr`` appended when given."""
        if self._basis is None:
            values = self.basis(self.length).to(self.dtype)
            self._basis = values if self.attr is None else torch.cat([values, self.attr], dim=-1)
        return self._basis

    @property
    def envelope_values(self) -> torch.Tensor:
        """``[E, 1]``: ``envelope(length)`` in ``dtype``."""
        if self._env is None:
            self._env = self.envelope(self.length).unsqueeze(-1).to(self.dtype)
        return self._env

    def materialize(self) -> RadialEdges:
        """Compute the basis and envelope values now (before checkpointed layers); returns self."""
        _ = self.basis_values, self.envelope_values
        return self
