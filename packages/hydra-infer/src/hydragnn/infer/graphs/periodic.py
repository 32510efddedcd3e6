"""Periodic engine: fully periodic cells of fixed atom counts, the cell a per-call graph input.

Key ``("periodic", counts, forces)`` (``counts``: atoms of each structure, so the batch layout is
fixed). Static inputs: ``pos [N, 3]``, ``numbers [N]``, ``cell [B, 3, 3]`` and ``graph_attr``;
species, positions and the cell may change on every call (MD at constant or varying cell).

The neighbour list runs inside the graph on preallocated buffers, so that nothing synchronises
with the host, by one of two searches chosen at build:

* cells at least 3 search radii wide in every direction (the large ones): a cell list in
  fractional coordinates (:mod:`.cells`), linear in N, pairs compacted into an edge buffer of
  ``capacity`` edges; after a replay the pair count, the fullest bin and whether the cell got too
  narrow for its bins (it may shrink by :data:`.cells.GRID_MARGIN`) decide a rebuild;
* smaller cells: nvalchemi-toolkit-ops' batched naive search (O(N^2) per structure, cheap at these
  sizes) into a neighbour matrix ``[N, capacity]`` with integer image shifts and a fixed range of
  periodic images prepared for a cutoff :data:`IMAGE_MARGIN` larger; ``_max_neighbours`` (the true
  largest count, reported even when the matrix truncated) and ``_images_short`` (the cell needs
  more images than prepared, from the perpendicular widths ``V / |a_j x a_k|``) decide a rebuild.

Either way candidates are searched a little beyond the cutoff and then kept by the regular path's
rule (``|r_j - r_i + S cell| < cutoff``, no zero-shift self pair); empty slots become sink -> sink
edges.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from hydragnn.data.validation import perpendicular_widths

from ..inputs import CallInputs
from .backends import Captured, Outputs
from .base import StaticEngine, with_sink
from .cells import Grid, overflow, plan_grid, search, search_radius
from .host import EngineHost
from .sparse import capacity_for

SPARE = 1.25
"""Neighbour-matrix width = ``SPARE`` x the largest count seen at build, rounded up to 8."""
IMAGE_MARGIN = 0.05
"""Periodic images are prepared for ``(1 + IMAGE_MARGIN) x`` the search cutoff."""


def images_needed(cell: torch.Tensor, cutoff: float) -> torch.Tensor:
    """``[B, 3]`` periodic images to search in each direction (nvalchemi's shift range)."""
    return torch.ceil(cutoff / perpendicular_widths(cell)).to(torch.int32)


def neighbour_capacity(call: CallInputs, cutoff: float) -> int:
    """Largest neighbour count of any atom of ``call`` (eager, at build), with room to spare."""
    from hydragnn.data.neighbors import radius_graph

    edge_index, _ = radius_graph(call.pos, cutoff, batch=call.batch, cell=call.cell, pbc=call.pbc)
    most = int(torch.bincount(edge_index[1], minlength=call.pos.shape[0]).max()) if edge_index.numel() else 0
    return max(8, -(-math.ceil(most * SPARE + 1) // 8) * 8)


def plan(host: EngineHost, call: CallInputs) -> Grid | None:
    """The cell-list grid of a periodic call, or ``None`` where a cell is too small for one (eager)."""
    radius = search_radius(float(host.info.cutoff), host.dtype)
    cell = cast(torch.Tensor, call.cell).to(host.dtype)
    return plan_grid(call.pos.to(host.dtype), call.batch, call.num_graphs, cell, radius)


def build_engine(
    host: EngineHost, call: CallInputs, counts: tuple[int, ...], forces: bool, grid: Grid | None = None
) -> PeriodicEngine:
    """A periodic engine sized for ``call``: a cell list where the cells allow one (``grid``, planned
    here when not given), else the naive search."""
    grid = plan(host, call) if grid is None else grid
    if grid is None:
        return PeriodicEngine(host, counts, forces, call, neighbour_capacity(call, host.info.cutoff))
    probe = PeriodicEngine(host, counts, forces, call, 1, grid)
    needed = probe.pair_count(call)
    probe.release()
    return PeriodicEngine(host, counts, forces, call, capacity_for(needed), grid)


class PeriodicEngine(StaticEngine):
    """Static-buffer engine for fully periodic structures (see the module docstring).

    ``grid`` (:func:`plan`): the cell-list search with an edge buffer of ``capacity`` edges; ``None``:
    the naive search with ``capacity`` neighbours per atom.
    """

    kind = "periodic"

    def __init__(
        self,
        host: EngineHost,
        counts: tuple[int, ...],
        forces: bool,
        call: CallInputs,
        capacity: int,
        grid: Grid | None = None,
    ) -> None:
        super().__init__(host, ("periodic", counts, forces), forces)
        self.counts = counts
        self.num_nodes, self.num_graphs, self.capacity = sum(counts), len(counts), capacity
        self.radius = search_radius(self.cutoff, self.dtype)
        self.grid = grid
        n, b, dev = self.num_nodes, self.num_graphs, self.device
        sizes = torch.tensor(counts, dtype=torch.long, device=dev)
        if grid is not None:
            self.buffers = {
                "pos": torch.zeros(n, 3, dtype=self.dtype, device=dev),
                "numbers": torch.zeros(n, dtype=torch.long, device=dev),
                "cell": torch.zeros(b, 3, 3, dtype=self.dtype, device=dev),
                "batch": torch.repeat_interleave(torch.arange(b, device=dev), sizes),
                "pbc": torch.ones(b, 3, dtype=torch.bool, device=dev),
                **{k: v.to(dev) for k, v in grid.buffers().items()},
            }
            self.add_graph_attr_buffer()
            return
        from hydragnn.data.neighbors.warp_import import nvalchemi_neighbors

        compute_naive_num_shifts = nvalchemi_neighbors().neighbor_utils.compute_naive_num_shifts
        ptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        ptr[1:] = torch.cumsum(sizes, 0)
        pbc = torch.ones(b, 3, dtype=torch.bool, device=dev)
        cell = cast(torch.Tensor, call.cell).to(self.dtype)  # a periodic engine serves calls with a cell
        shift_range, num_shifts, max_shifts = compute_naive_num_shifts(cell, self.radius * (1 + IMAGE_MARGIN), pbc)
        self.max_shifts = int(max_shifts)
        self.max_atoms = int(max(counts))
        self.buffers = {
            "pos": torch.zeros(n, 3, dtype=self.dtype, device=dev),
            "numbers": torch.zeros(n, dtype=torch.long, device=dev),
            "cell": torch.zeros(b, 3, 3, dtype=self.dtype, device=dev),
            "batch": torch.repeat_interleave(torch.arange(b, device=dev), sizes),
            "batch_idx": torch.repeat_interleave(torch.arange(b, device=dev, dtype=torch.int32), sizes),
            "batch_ptr": ptr,
            "pbc": pbc,
            "shift_range": shift_range.contiguous(),
            "num_shifts": num_shifts.contiguous(),
            "matrix": torch.full((n, capacity), n, dtype=torch.int32, device=dev),
            "shifts": torch.zeros(n, capacity, 3, dtype=torch.int32, device=dev),
            "num_neighbours": torch.zeros(n, dtype=torch.int32, device=dev),
            "wrapped": torch.zeros(n, 3, dtype=self.dtype, device=dev),
            "cell_offsets": torch.zeros(n, 3, dtype=torch.int32, device=dev),
            "inv_cell": torch.zeros(b, 3, 3, dtype=self.dtype, device=dev),
            "targets": torch.arange(n, device=dev).unsqueeze(1).expand(n, capacity).contiguous(),
            "slots": torch.arange(capacity, device=dev),
        }
        self.add_graph_attr_buffer()

    def _cell_search(self, pos: torch.Tensor, cell: torch.Tensor, capacity: int):
        grid = cast(Grid, self.grid)
        tensors = {k: self.buffers[k] for k in Grid.KEYS}
        return search(pos, self.buffers["batch"], cell, tensors, grid.total, grid.capacity, self.radius, capacity)

    def pair_count(self, call: CallInputs) -> int:
        """Pairs ``call`` needs within the search radius (cell-list engines; eager)."""
        cell = cast(torch.Tensor, call.cell).to(self.dtype)
        return int(self._cell_search(call.pos.to(self.dtype), cell, 1).count)

    def _fn_cells(self) -> Outputs:
        buf = self.buffers
        found = self._cell_search(buf["pos"], buf["cell"], self.capacity)
        pos, z, batch = with_sink(buf["pos"], buf["numbers"], buf["batch"], self.num_graphs)
        cell = torch.cat([buf["cell"], torch.eye(3, dtype=self.dtype, device=self.device).unsqueeze(0)])
        offset = torch.einsum(
            "ek,ekj->ej", found.image.to(self.dtype), cell.index_select(0, batch.index_select(0, found.dst))
        )
        edge_index, kept = found.edges(pos, self.cutoff, offset)
        edge_shift = torch.where(kept.unsqueeze(-1), offset, torch.zeros_like(offset))
        pbc = torch.cat([buf["pbc"], buf["pbc"].new_zeros(1, 3)])
        out = self.forward(pos, z, batch, edge_index, edge_shift=edge_shift, cell=cell, pbc=pbc)
        return {**out, **found.outputs()}

    def fn(self) -> Outputs:
        if self.grid is not None:
            return self._fn_cells()
        from hydragnn.data.neighbors.warp_import import nvalchemi_neighbors

        batch_naive_neighbor_list = nvalchemi_neighbors().batch_naive_neighbor_list
        buf = self.buffers
        sink = self.num_nodes
        matrix, num, shifts = batch_naive_neighbor_list(
            buf["pos"],
            self.radius,
            batch_idx=buf["batch_idx"],
            batch_ptr=buf["batch_ptr"],
            pbc=buf["pbc"],
            cell=buf["cell"],
            neighbor_matrix=buf["matrix"],
            neighbor_matrix_shifts=buf["shifts"],
            num_neighbors=buf["num_neighbours"],
            shift_range_per_dimension=buf["shift_range"],
            num_shifts_per_system=buf["num_shifts"],
            max_shifts_per_system=self.max_shifts,
            max_atoms_per_system=self.max_atoms,
            positions_wrapped_buffer=buf["wrapped"],
            per_atom_cell_offsets_buffer=buf["cell_offsets"],
            inv_cell_buffer=buf["inv_cell"],
        )
        pos, z, batch = with_sink(buf["pos"], buf["numbers"], buf["batch"], self.num_graphs)
        src = matrix.long().clamp(0, sink).reshape(-1)
        dst = buf["targets"].reshape(-1)
        image = shifts.to(self.dtype).reshape(-1, 3)
        offset = torch.einsum("ek,ekj->ej", image, buf["cell"][buf["batch"]][dst])
        vec = pos[src] - pos[dst] + offset
        filled = (buf["slots"].unsqueeze(0) < num.unsqueeze(1)).reshape(-1) & (src < sink)
        self_pair = (src == dst) & (shifts.reshape(-1, 3) == 0).all(dim=-1)
        valid = filled & ~self_pair & (vec.pow(2).sum(-1) < self.cutoff * self.cutoff)
        edge_index = torch.stack([torch.where(valid, src, sink), torch.where(valid, dst, sink)])
        edge_shift = torch.where(valid.unsqueeze(-1), offset, torch.zeros_like(offset))
        cell = torch.cat([buf["cell"], torch.eye(3, dtype=self.dtype, device=self.device).unsqueeze(0)])
        pbc = torch.cat([buf["pbc"], buf["pbc"].new_zeros(1, 3)])
        out = self.forward(pos, z, batch, edge_index, edge_shift=edge_shift, cell=cell, pbc=pbc)
        out["_max_neighbours"] = num.max()
        out["_images_short"] = (images_needed(buf["cell"], self.radius) > buf["shift_range"]).any()
        return out

    def load(self, call: CallInputs) -> None:
        buf = self.buffers
        buf["pos"].copy_(call.pos.to(self.dtype))
        buf["numbers"].copy_(call.numbers)
        buf["cell"].copy_(cast(torch.Tensor, call.cell).to(self.dtype))  # a periodic call
        self.load_graph_attr(call)

    def overflowed(self) -> int | None:
        """After a replay: ``None`` when the buffers fit, else a reason to rebuild (the neighbour count)."""
        outputs = cast(Captured, self.graph).outputs  # captured before any replay
        if self.grid is not None:
            return overflow(outputs, self.capacity, self.grid.capacity)
        most = int(outputs["_max_neighbours"])
        if most > self.capacity or bool(outputs["_images_short"]):
            return most
        return None

    def node_index(self, call: CallInputs) -> torch.Tensor:
        return torch.arange(self.num_nodes, device=self.device)
