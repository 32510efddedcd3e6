"""``RadialEdges``: one forward pass's view of the edges for the radial primitives.

An encoder builds it once per forward from its edge lengths and hands it to every layer. The
radial basis and envelope values are computed on first use and shared by all layers (the stock
path), while a fused backend reads ``length`` and the ``basis`` / ``envelope`` modules and never
materialises them. Under activation checkpointing the encoder calls :meth:`materialize` first,
so a recomputed layer finds the same cached tensors it used the first time.

Per-edge functions of the length alone (the basis, a radial filter network) may be evaluated
once per *distinct* length (:meth:`RadialEdges.shared_lengths`) when the lengths are constants of
the call: both directions of an edge have bitwise-equal lengths, and graphs on a lattice (fixed
sites, species varying: HydraGNN's alloy and Ising data, upstream's unit-test graphs) repeat a
handful of distances across a whole batch. Never when a gradient flows to the lengths (forces,
stress): equal lengths of different atom pairs have different position derivatives.
"""

from __future__ import annotations

import torch
from torch import nn

SHARED_MAX_FRACTION = 0.75
"""Largest fraction of distinct lengths among the edges for which per-edge functions of the
length are evaluated per distinct length (one direction of each edge: 0.5; a lattice: ~0)."""


def distinct_values(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(values [P], inverse [M])`` with ``x == values[inverse]``, the distinct entries of a 1-D
    ``x`` in ascending order, where evaluating a function of ``x`` once per distinct entry is exact
    and pays; else ``None``: a gradient flows to ``x`` (forces or stress by autograd: equal values
    of different atom pairs have different position derivatives), ``x`` is not on the CPU
    (``unique`` synchronises a GPU and has a data-dependent shape, which CUDA-graph capture and
    compilation refuse), torch is compiling, or more than :data:`SHARED_MAX_FRACTION` of the
    entries are distinct (the gather back would not pay)."""
    if x.requires_grad or x.device.type != "cpu" or x.dim() != 1 or torch.compiler.is_compiling():
        return None
    values, inverse = torch.unique(x, sorted=True, return_inverse=True)
    return (values, inverse) if values.shape[0] <= SHARED_MAX_FRACTION * x.shape[0] else None


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

    __slots__ = (
        "src", "dst", "length", "num_nodes", "dtype", "basis", "envelope", "unit", "attr", "_basis", "_env", "_shared",
        "_shared_basis",
    )  # fmt: skip

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
        self._shared: tuple[torch.Tensor, torch.Tensor] | None | bool = False  # False: not computed yet
        self._shared_basis: torch.Tensor | None = None

    @property
    def basis_values(self) -> torch.Tensor:
        """``[E, R (+A)]``: ``basis(length)`` in ``dtype``, with ``attr`` appended when given."""
        if self._basis is None:
            values: torch.Tensor = self.basis(self.length).to(self.dtype)
            self._basis = values if self.attr is None else torch.cat([values, self.attr], dim=-1)
        return self._basis

    @property
    def envelope_values(self) -> torch.Tensor:
        """``[E, 1]``: ``envelope(length)`` in ``dtype``."""
        if self._env is None:
            env: torch.Tensor = self.envelope(self.length)
            self._env = env.unsqueeze(-1).to(self.dtype)
        return self._env

    def shared_lengths(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:func:`distinct_values` of ``length``: ``(values [P], inverse [E])`` or ``None``.
        Computed once per instance."""
        if self._shared is False:
            self._shared = distinct_values(self.length)
        return self._shared  # type: ignore[return-value]

    def shared_basis_values(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(basis(values) [P, R] in dtype, inverse [E])`` for the :meth:`shared_lengths`, so that
        ``basis_values == basis[inverse]``; ``None`` where those do not apply or edge inputs
        ``attr`` are appended to the basis (the rows then differ beyond the length). Computed once
        per instance, like :attr:`basis_values`."""
        shared = self.shared_lengths() if self.attr is None else None
        if shared is None:
            return None
        values, inverse = shared
        if self._shared_basis is None:
            shared_basis: torch.Tensor = self.basis(values)
            self._shared_basis = shared_basis.to(self.dtype)
        return self._shared_basis, inverse

    def with_basis_values(self, values: torch.Tensor) -> RadialEdges:
        """These edges with :attr:`basis_values` replaced by ``values [E, K]`` (a learned function
        of them, such as a radial MLP); geometry and envelope values are shared, and no
        :meth:`shared_basis_values` (the new values are not the basis module's)."""
        out = RadialEdges(
            self.src, self.dst, self.length, self.num_nodes, self.dtype, self.basis, self.envelope, self.unit
        )
        out._basis, out._env, out._shared = values, self.envelope_values, None
        return out

    def materialize(self) -> RadialEdges:
        """Compute the basis and envelope values (and those at the distinct lengths) now, before
        checkpointed layers; returns self."""
        _ = self.basis_values, self.envelope_values, self.shared_basis_values()
        return self
