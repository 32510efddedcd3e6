"""Neighbour-list reuse with a Verlet skin for the regular path (molecular dynamics).

:class:`NeighborCache` keeps, per call signature (atom count, structures, atomic numbers, cell,
pbc, dtype, device), the edges of :func:`hydragnn.data.neighbors.radius_graph` within
``cutoff + skin`` and the positions they were built at. A later call with the same signature in
which no atom moved more than ``skin / 2`` (plain Cartesian displacement of the given positions,
the largest over all atoms of all structures) reuses them: edge lengths are recomputed for the
current positions exactly as hydra-data's ``finalize_edges`` does (component by component in the
dtype of ``pos``) and the edges shorter than ``cutoff`` are kept. Any pair now closer than
``cutoff`` was closer than ``cutoff + skin`` at the build, so the result is the fresh list within
``cutoff``: same edges, same order (a subsequence of a list sorted by ``(target, source,
shift)``), same Cartesian shifts (the cell is unchanged), hence bit-identical model outputs.

Calls that always rebuild (no reuse, today's behaviour): ``skin == 0``, models with a neighbour
cap (``max_neighbours``: the k nearest depend on the current distances), inputs requiring grad
(the shifts must stay differentiable with respect to the cell), empty calls, and periodic cells
too thin for ``cutoff + skin`` (then the list is built within ``cutoff``). The CUDA-graph
engines build their own lists in the graph and do not use this cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from hydragnn.data.neighbors import radius_graph
from hydragnn.data.validation import StructureError

from .errors import InferenceError
from .inputs import CallInputs

#: Signatures remembered per calculator (least recently used dropped first).
MAX_ENTRIES = 8
#: The MD adapters' default skin (Å). At 300 K a Cu atom moves ~0.003-0.01 Å per 1 fs step, so the
#: fastest atom crosses 0.25 Å after tens of steps, while the searched pairs grow only by
#: ``((cutoff + 0.5) / cutoff) ** 3`` (1.33x at 5 Å); ASE's own NeighborList uses 0.3 Å, JAX-MD 0.5 Å.
MD_SKIN = 0.5


def check_skin(skin: object) -> float:
    """``skin`` as a float, or :class:`InferenceError` for anything but a finite real >= 0."""
    if isinstance(skin, bool) or not isinstance(skin, Real) or not math.isfinite(float(skin)) or float(skin) < 0:
        raise InferenceError(f"skin: expected a finite float >= 0 (Å; 0 disables neighbour-list reuse), found {skin!r}")
    return float(skin)


def md_skin(calc: Any, skin: float | None) -> float:
    """The skin an MD adapter gives ``calc`` (a :class:`~.calculator.HydraCalculator`) when built with ``skin``.

    ``None``: :data:`MD_SKIN` when the model takes its edges from the calculator's list and reuse
    applies to it (no ``dynamic_graph``, no ``max_neighbours``), else 0. A value is checked.
    """
    if skin is not None:
        return check_skin(skin)
    applies = calc.info.max_neighbours is None and not calc.model.config.mlip.dynamic_graph
    return MD_SKIN if applies else 0.0


@dataclass
class _Entry:
    """A list built within ``cutoff + skin`` for one signature, and the positions it was built at."""

    numbers: torch.Tensor
    batch: torch.Tensor
    cell: torch.Tensor | None
    pbc: torch.Tensor | None
    pos: torch.Tensor
    edge_index: torch.Tensor
    edge_shift: torch.Tensor

    def matches(self, call: CallInputs) -> bool:
        if self.pos.shape != call.pos.shape or self.pos.dtype != call.pos.dtype or self.pos.device != call.pos.device:
            return False
        if (self.cell is None) != (call.cell is None) or self.batch.shape != call.batch.shape:
            return False
        if not (torch.equal(self.numbers, call.numbers) and torch.equal(self.batch, call.batch)):
            return False
        return self.cell is None or (torch.equal(self.cell, call.cell) and torch.equal(self.pbc, call.pbc))


class NeighborCache:
    """Edges within ``cutoff`` for validated calls, reused across calls while atoms stay within ``skin / 2``.

    Args:
        skin: Verlet skin (Å, >= 0); 0 builds a fresh list on every call.

    Attributes:
        builds: calls whose edges came from a neighbour search.
        reuses: calls whose edges were filtered from a remembered list.
    """

    def __init__(self, skin: float = 0.0) -> None:
        self.skin = check_skin(skin)
        self.builds = 0
        self.reuses = 0
        self._entries: list[_Entry] = []

    def stats(self) -> dict[str, int]:
        return {"builds": self.builds, "reuses": self.reuses}

    def clear(self) -> None:
        """Forget every remembered list (counters kept)."""
        self._entries.clear()

    def edges(self, call: CallInputs, cutoff: float, max_neighbours: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``edge_index [2, E]`` and ``edge_shift [E, 3]`` of the call, as ``radius_graph`` within ``cutoff`` gives them."""
        cutoff = float(cutoff)
        if self.skin == 0.0 or max_neighbours is not None or call.requires_grad or call.pos.shape[0] == 0:
            return self._fresh(call, cutoff, max_neighbours)
        for i, entry in enumerate(self._entries):
            if entry.matches(call):
                del self._entries[i]
                moved = (call.pos - entry.pos).square().sum(dim=1).max()
                if float(moved) <= (self.skin / 2) ** 2:
                    self._entries.append(entry)
                    self.reuses += 1
                    return _filter(entry, call.pos, cutoff)
                break
        entry = self._build(call, cutoff)
        if entry is None:
            return self._fresh(call, cutoff, None)
        self._entries.append(entry)
        del self._entries[:-MAX_ENTRIES]
        self.builds += 1
        return _filter(entry, call.pos, cutoff)

    def _fresh(self, call: CallInputs, cutoff: float, max_neighbours: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        self.builds += 1
        return radius_graph(
            call.pos, cutoff, batch=call.batch, cell=call.cell, pbc=call.pbc, max_neighbours=max_neighbours
        )

    def _build(self, call: CallInputs, cutoff: float) -> _Entry | None:
        """The list within ``cutoff + skin`` (plus a rounding margin), or ``None`` for a cell too thin for it."""
        scale = float(call.pos.abs().max()) + cutoff + self.skin
        radius = cutoff + self.skin * (1 + 1e-3) + 64 * torch.finfo(call.pos.dtype).eps * scale
        try:
            edge_index, edge_shift = radius_graph(call.pos, radius, batch=call.batch, cell=call.cell, pbc=call.pbc)
        except StructureError:
            return None
        return _Entry(
            numbers=call.numbers.clone(),
            batch=call.batch.clone(),
            cell=None if call.cell is None else call.cell.clone(),
            pbc=None if call.pbc is None else call.pbc.clone(),
            pos=call.pos.clone(),
            edge_index=edge_index,
            edge_shift=edge_shift,
        )


def _filter(entry: _Entry, pos: torch.Tensor, cutoff: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The remembered edges shorter than ``cutoff`` at ``pos``, with hydra-data's length arithmetic."""
    src, dst = entry.edge_index[0], entry.edge_index[1]
    pos_t = pos.T.contiguous()
    vec = [pos_t[d].index_select(0, src) - pos_t[d].index_select(0, dst) for d in range(3)]
    if entry.cell is not None:
        shift_t = entry.edge_shift.T
        vec = [v + shift_t[d] for d, v in enumerate(vec)]
    keep = (vec[0] * vec[0] + vec[1] * vec[1] + vec[2] * vec[2] < cutoff * cutoff).nonzero().squeeze(1)
    return entry.edge_index.index_select(1, keep), entry.edge_shift.index_select(0, keep)
