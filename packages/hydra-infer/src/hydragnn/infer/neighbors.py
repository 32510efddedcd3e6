"""Neighbour-list reuse with a Verlet skin for the regular path (molecular dynamics).

:class:`NeighborCache` keeps, per call layout (atom count, structures, atomic numbers, pbc,
dtype, device), the edges of :func:`hydragnn.data.neighbors.radius_graph` within
``cutoff + skin``, with integer image offsets, and the positions and cells each structure's
list was built at. Each structure of a later call with the same layout reuses its list when

    cutoff / s + 2 * max_a |d_a| <= cutoff + skin,

where ``s`` is the smallest singular value of the cell deformation ``F`` (``cell_now = cell_built @ F``,
rows are lattice vectors; 1 for an unchanged cell or no cell) and ``d_a`` is atom ``a``'s
displacement since the build in the built cell's frame (``pos_now @ F^-1 - pos_built``), modulo
lattice vectors along periodic directions (an atom wrapped back into the cell has not moved).
For a fixed cell this is ``max |d_a| <= skin / 2``; a strained cell (NPT, cell filters) uses up
part of the skin. A pair now closer than ``cutoff`` was then closer than
``cutoff + skin`` at the build, so the kept edges, their offsets corrected for wrapped atoms,
filtered by their current lengths (computed as hydra-data's ``finalize_edges`` does, component
by component in the dtype of ``pos``) are the fresh list within ``cutoff``: same edges, same
order (sorted by ``(target, source, shift)``), same Cartesian shifts, hence bit-identical model
outputs. Structures that fail the test are searched again, alone; the others keep their lists.

Calls that always search every structure: ``skin == 0``, models with a neighbour cap
(``max_neighbours``: the k nearest depend on the current distances), inputs requiring grad (the
shifts must stay differentiable with respect to the cell), empty calls, and periodic cells too
thin for ``cutoff + skin`` (then the list is built within ``cutoff``). The CUDA-graph engines
build their own lists in the graph and do not use this cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, cast

import torch

from hydragnn.data.neighbors import radius_graph
from hydragnn.data.neighbors.brute_force import cartesian_shift
from hydragnn.data.neighbors.inputs import complete_cells
from hydragnn.data.validation import StructureError

from .errors import InferenceError
from .inputs import CallInputs

#: Layouts remembered per calculator (least recently used dropped first).
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


@dataclass(eq=False)
class _Entry:
    """Lists built within ``cutoff + skin`` for one layout, and where each structure's list was built.

    Attributes:
        numbers, batch: ``[N]`` of the layout.
        pbc: ``[B, 3]`` or ``None`` (no cell).
        pos: ``[N, 3]`` positions at each structure's last build.
        cell: ``[B, 3, 3]`` cells at each structure's last build, or ``None``.
        frame: ``[B, 3, 3]`` float64 :func:`complete_cells` of ``cell`` (invertible), or ``None``.
        edge_index: ``[2, E]`` edges, sorted by ``(target, source, shift)``.
        image: ``[E, 3]`` int64 image offsets at the build positions (zeros without a cell).
        shift: ``[E, 3]`` Cartesian offsets ``image @ cell`` at the build cells, as ``radius_graph`` gave them.
    """

    numbers: torch.Tensor
    batch: torch.Tensor
    pbc: torch.Tensor | None
    pos: torch.Tensor
    cell: torch.Tensor | None
    frame: torch.Tensor | None
    edge_index: torch.Tensor
    image: torch.Tensor
    shift: torch.Tensor

    def matches(self, call: CallInputs) -> bool:
        if self.pos.shape != call.pos.shape or self.pos.dtype != call.pos.dtype or self.pos.device != call.pos.device:
            return False
        if (self.cell is None) != (call.cell is None) or self.batch.shape != call.batch.shape:
            return False
        if not (torch.equal(self.numbers, call.numbers) and torch.equal(self.batch, call.batch)):
            return False
        if self.cell is None:
            return True
        # a periodic entry (cell, pbc) and, as checked above, a periodic call
        pbc, call_cell, call_pbc = (
            cast(torch.Tensor, self.pbc),
            cast(torch.Tensor, call.cell),
            cast(torch.Tensor, call.pbc),
        )
        return self.cell.shape == call_cell.shape and torch.equal(pbc, call_pbc)


class NeighborCache:
    """Edges within ``cutoff`` for validated calls, each structure's list reused while the skin criterion holds.

    Args:
        skin: Verlet skin (Å, >= 0); 0 builds a fresh list on every call.

    Attributes:
        builds: calls that searched neighbours (of one structure at least).
        reuses: calls whose edges all came from kept lists.
    """

    def __init__(self, skin: float = 0.0) -> None:
        self.skin = check_skin(skin)
        self.builds = 0
        self.reuses = 0
        self._entries: list[_Entry] = []

    def stats(self) -> dict[str, int]:
        return {"builds": self.builds, "reuses": self.reuses}

    def clear(self) -> None:
        """Forget every kept list (counters kept)."""
        self._entries.clear()

    def edges(self, call: CallInputs, cutoff: float, max_neighbours: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``edge_index [2, E]`` and ``edge_shift [E, 3]`` of the call, as ``radius_graph`` within ``cutoff`` gives them."""
        cutoff = float(cutoff)
        if self.skin == 0.0 or max_neighbours is not None or call.requires_grad or call.pos.shape[0] == 0:
            return self._fresh(call, cutoff, max_neighbours)
        entry = next((e for e in self._entries if e.matches(call)), None)
        if entry is None:
            entry = _new_entry(call)
            stale, wrap, strained = torch.ones(call.num_graphs, dtype=torch.bool, device=call.pos.device), None, None
        else:
            self._entries.remove(entry)
            stale, wrap, strained = _stale(entry, call, cutoff, self.skin)
        if bool(stale.any()):
            if not _rebuild(entry, call, stale, cutoff, self.skin):
                return self._fresh(call, cutoff, None)
            if wrap is not None:  # a searched structure's atoms are where its list was built
                wrap = wrap.masked_fill(stale.index_select(0, call.batch).unsqueeze(1), 0)
            if strained is not None:
                strained = strained & ~stale
            self.builds += 1
        else:
            self.reuses += 1
        self._entries.append(entry)
        del self._entries[:-MAX_ENTRIES]
        return _current(entry, call, wrap, strained, cutoff)

    def _fresh(self, call: CallInputs, cutoff: float, max_neighbours: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        self.builds += 1
        return radius_graph(
            call.pos, cutoff, batch=call.batch, cell=call.cell, pbc=call.pbc, max_neighbours=max_neighbours
        )


def _new_entry(call: CallInputs) -> _Entry:
    """An entry for the call's layout with no list yet (every structure to be searched)."""
    frame = None
    if call.cell is not None:
        frame = torch.zeros(call.num_graphs, 3, 3, dtype=torch.float64, device=call.pos.device)
    return _Entry(
        numbers=call.numbers.clone(),
        batch=call.batch.clone(),
        pbc=None if call.pbc is None else call.pbc.clone(),
        pos=call.pos.clone(),
        cell=None if call.cell is None else call.cell.clone(),
        frame=frame,
        edge_index=call.batch.new_zeros(2, 0),
        image=call.batch.new_zeros(0, 3),
        shift=call.pos.new_zeros(0, 3),
    )


def _stale(
    entry: _Entry, call: CallInputs, cutoff: float, skin: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Which structures need a new search, how far atoms were wrapped, which cells were strained.

    Returns:
        ``[B]`` bool, True where the kept list may miss a pair within ``cutoff``; ``[N, 3]`` int64
        lattice vectors each atom was wrapped by since its build (``None``: none was); ``[B]`` bool
        cells that differ from their build (``None``: none does).
    """
    pos, built, batch = call.pos.to(torch.float64), entry.pos.to(torch.float64), call.batch
    limit = torch.full((call.num_graphs,), skin / 2, dtype=torch.float64, device=pos.device)
    wrap = strained = None
    if entry.cell is not None:
        # a periodic entry (frame) matched to a periodic call (cell, pbc)
        cell, pbc, frame = cast(torch.Tensor, call.cell), cast(torch.Tensor, call.pbc), cast(torch.Tensor, entry.frame)
        same = (cell == entry.cell).flatten(1).all(dim=1)
        if not bool(same.all()):
            deform = torch.linalg.solve(frame, complete_cells(cell, pbc))  # frame_now = frame @ F
            deform[same] = torch.eye(3, dtype=torch.float64, device=pos.device)
            reach = cutoff / torch.linalg.svdvals(deform)[:, -1]  # a pair within cutoff now was within reach
            limit = torch.where(same, limit, (skin - (reach - cutoff)) / 2)
            pos = torch.einsum("nd,nde->ne", pos, torch.linalg.inv(deform).index_select(0, batch))
            strained = ~same
    moved = pos - built
    dist2 = moved.square().sum(dim=1)
    bound2 = limit.clamp_min(0.0).square()
    if entry.cell is not None:
        pbc, frame = cast(torch.Tensor, call.pbc), cast(torch.Tensor, entry.frame)  # periodic, as above
        far = (dist2 > bound2.index_select(0, batch)) & pbc.any(dim=1).index_select(0, batch)
        atoms = far.nonzero().squeeze(1)  # wrapped back into the cell, or moved too far
        if atoms.numel():
            frames = frame.index_select(0, batch.index_select(0, atoms))
            frac = torch.linalg.solve(frames.mT, moved.index_select(0, atoms).unsqueeze(-1)).squeeze(-1)
            lattice = torch.where(pbc.index_select(0, batch.index_select(0, atoms)), frac.round(), 0.0)
            dist2[atoms] = (moved.index_select(0, atoms) - torch.einsum("nd,nde->ne", lattice, frames)).square().sum(1)
            wrap = torch.zeros_like(call.pos, dtype=torch.long)
            wrap[atoms] = lattice.long()
    largest = torch.zeros_like(limit).scatter_reduce(0, batch, dist2, "amax")
    return (limit < 0) | (largest > bound2), wrap, strained


def _rebuild(entry: _Entry, call: CallInputs, stale: torch.Tensor, cutoff: float, skin: float) -> bool:
    """Search the ``stale`` structures within ``cutoff + skin`` (plus a rounding margin) and keep their lists.

    Returns False, leaving ``entry`` unusable, for a cell too thin for ``cutoff + skin``.
    """
    atoms = stale.index_select(0, call.batch).nonzero().squeeze(1)
    graphs = stale.nonzero().squeeze(1)
    if call.cell is not None:
        # the entry of a periodic call keeps a cell and its frame; pbc comes with the cell
        frame, entry_cell = cast(torch.Tensor, entry.frame), cast(torch.Tensor, entry.cell)
        frame[graphs] = complete_cells(call.cell[graphs], cast(torch.Tensor, call.pbc)[graphs])
        entry_cell[graphs] = call.cell[graphs]
    if not atoms.numel():
        return True
    pos = call.pos.index_select(0, atoms)
    batch = (torch.cumsum(stale, 0) - 1).index_select(0, call.batch.index_select(0, atoms))
    cell = None if call.cell is None else call.cell.index_select(0, graphs)
    pbc = None if call.pbc is None else call.pbc.index_select(0, graphs)
    scale = float(pos.abs().max()) + cutoff + skin
    radius = cutoff + skin * (1 + 1e-3) + 64 * torch.finfo(pos.dtype).eps * scale
    try:
        edge_index, shift = radius_graph(pos, radius, batch=batch, cell=cell, pbc=pbc)
    except StructureError:
        return False
    image = torch.zeros(shift.shape, dtype=torch.long, device=pos.device)
    if cell is not None:
        inverse = torch.linalg.inv(cast(torch.Tensor, entry.frame)[graphs]).index_select(
            0, batch.index_select(0, edge_index[1])
        )
        image = torch.einsum("ed,edk->ek", shift.to(torch.float64), inverse).round().long()
    entry.pos[atoms] = pos
    kept = ~stale.index_select(0, call.batch.index_select(0, entry.edge_index[1]))
    edge_index = torch.cat([entry.edge_index[:, kept], atoms[edge_index]], dim=1)
    order = torch.sort(edge_index[1], stable=True).indices  # structures' blocks back in atom order
    entry.edge_index = edge_index[:, order]
    entry.image = torch.cat([entry.image[kept], image])[order]
    entry.shift = torch.cat([entry.shift[kept], shift])[order]
    return True


def _current(
    entry: _Entry, call: CallInputs, wrap: torch.Tensor | None, strained: torch.Tensor | None, cutoff: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept edges shorter than ``cutoff`` at the call's positions, with hydra-data's arithmetic.

    Edges of a strained structure or touching a wrapped atom get ``image @ cell`` recomputed as
    ``radius_graph`` computes it; the others keep the shift of their build (the same numbers).
    """
    src, dst = entry.edge_index[0], entry.edge_index[1]
    pos_t = call.pos.T.contiguous()
    vec = [pos_t[d].index_select(0, src) - pos_t[d].index_select(0, dst) for d in range(3)]
    shift = entry.shift
    if call.cell is not None:
        if wrap is not None or strained is not None:
            redo = torch.zeros_like(src, dtype=torch.bool)
            if wrap is not None:
                wrapped = wrap.any(dim=1)
                redo |= wrapped.index_select(0, src) | wrapped.index_select(0, dst)
            else:
                wrap = torch.zeros_like(call.pos, dtype=torch.long)
            if strained is not None:
                redo |= strained.index_select(0, call.batch.index_select(0, dst))
            redo = redo.nonzero().squeeze(1)
            s, t = src.index_select(0, redo), dst.index_select(0, redo)
            image = entry.image.index_select(0, redo) - wrap.index_select(0, s) + wrap.index_select(0, t)
            cells = call.cell.index_select(0, call.batch.index_select(0, t))
            shift = shift.index_copy(0, redo, cartesian_shift(image, cells))
        shift_t = shift.T
        vec = [v + shift_t[d] for d, v in enumerate(vec)]
    keep = (vec[0] * vec[0] + vec[1] * vec[1] + vec[2] * vec[2] < cutoff * cutoff).nonzero().squeeze(1)
    return entry.edge_index.index_select(1, keep), shift.index_select(0, keep)
