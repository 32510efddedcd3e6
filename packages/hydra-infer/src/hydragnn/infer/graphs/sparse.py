"""Sparse (neighbour-list) engine: flat batches of open structures, an edge buffer with spare capacity.

Key ``("sparse", N, B, forces)``. Static inputs: ``pos [N, 3]``, ``numbers [N]``, ``batch [N]``
(structure of each atom, sorted), ``graph_attr [B + 1, G]``; one sink node in a sink graph. The
neighbour search runs inside the graph on a cell list (:mod:`.cells`: bins over each structure's
bounding box with a spare bin around it), linear in N in time and memory; pairs within the cutoff
are compacted into an edge buffer of ``capacity`` edges (unused slots point sink -> sink). After a
replay the engine reads three static outputs: the pair count (above the capacity the edge list
was truncated), the fullest bin (above the bins' capacity atoms were dropped from the table) and
whether an atom left the grid; any of them makes the cache rebuild the engine for the current
call and re-validate it.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from ..inputs import CallInputs
from .backends import Captured, Outputs
from .base import StaticEngine, with_sink
from .cells import Grid, overflow, plan_grid, search, search_radius
from .host import EngineHost

SPARE = 1.25
"""Edge capacity = ``SPARE`` x the edge count seen at build (+ ``MIN_SPARE``)."""
MIN_SPARE = 16


def capacity_for(edges: int) -> int:
    return int(math.ceil(edges * SPARE)) + MIN_SPARE


class SparseEngine(StaticEngine):
    """Static-buffer engine for a flat batch with an in-graph cell-list search (see the module docstring).

    Build it with :meth:`for_call` (plans the grid and the edge capacity from the call).
    """

    kind = "sparse"

    def __init__(
        self, host: EngineHost, num_atoms: int, num_graphs: int, forces: bool, capacity: int, grid: Grid
    ) -> None:
        super().__init__(host, ("sparse", num_atoms, num_graphs, forces), forces)
        self.num_nodes, self.num_graphs, self.capacity = num_atoms, num_graphs, capacity
        self.grid = grid
        self.radius = search_radius(self.cutoff, self.dtype)
        dev = self.device
        self.buffers = {
            "pos": torch.zeros(num_atoms, 3, dtype=self.dtype, device=dev),
            "numbers": torch.zeros(num_atoms, dtype=torch.long, device=dev),
            "batch": torch.zeros(num_atoms, dtype=torch.long, device=dev),
            **{k: v.to(dev) for k, v in grid.buffers().items()},
        }
        self.add_graph_attr_buffer()

    @classmethod
    def plan(cls, host: EngineHost, call: CallInputs) -> Grid:
        """The grid of ``call`` (eager)."""
        radius = search_radius(float(host.info.cutoff), host.dtype)
        grid = plan_grid(call.pos.to(host.dtype), call.batch, call.num_graphs, None, radius)
        return cast(Grid, grid)  # open structures always get a grid

    @classmethod
    def for_call(cls, host: EngineHost, call: CallInputs, forces: bool, grid: Grid | None = None) -> SparseEngine:
        """An engine sized for ``call``: its grid and ``capacity_for`` its pair count."""
        grid = cls.plan(host, call) if grid is None else grid
        probe = cls(host, call.pos.shape[0], call.num_graphs, forces, 1, grid)
        needed = probe.edge_count(call)
        probe.release()
        return cls(host, call.pos.shape[0], call.num_graphs, forces, capacity_for(needed), grid)

    def _search(self, pos: torch.Tensor, batch: torch.Tensor, capacity: int):
        grid = {k: self.buffers[k] for k in Grid.KEYS}
        return search(pos, batch, None, grid, self.grid.total, self.grid.capacity, self.radius, capacity)

    def fn(self) -> Outputs:
        buf = self.buffers
        found = self._search(buf["pos"], buf["batch"], self.capacity)
        nodes = with_sink(buf["pos"], buf["numbers"], buf["batch"], self.num_graphs)
        edge_index, _ = found.edges(nodes[0], self.cutoff)
        return {**self.forward(*nodes, edge_index), **found.outputs()}

    def load(self, call: CallInputs) -> None:
        buf = self.buffers
        buf["pos"].copy_(call.pos.to(self.dtype))
        buf["numbers"].copy_(call.numbers)
        buf["batch"].copy_(call.batch)
        self.load_graph_attr(call)

    def edge_count(self, call: CallInputs) -> int:
        """Pairs ``call`` needs within the search radius (eager, outside any capture)."""
        return int(self._search(call.pos.to(self.dtype), call.batch, 1).count)

    def overflowed(self) -> int | None:
        """After a replay: ``None`` when the buffers held the call, else its pair count (a rebuild)."""
        return overflow(
            cast(Captured, self.graph).outputs, self.capacity, self.grid.capacity
        )  # captured before any replay

    def node_index(self, call: CallInputs) -> torch.Tensor:
        return torch.arange(self.num_nodes, device=self.device)
