"""Sparse (neighbour-list) engine: flat atoms, an edge buffer with spare capacity.

Key ``("sparse", N, B, forces)``. Static inputs: ``pos [N, 3]``, ``numbers [N]``, ``batch [N]``
(structure of each atom, sorted), ``graph_attr [B + 1, G]``; one sink node in a sink graph. The
neighbour search runs inside the graph without host synchronisation: every ordered pair of
atoms of one structure within the cutoff is compacted by a prefix sum into an edge buffer of
``capacity`` edges (unused slots point sink -> sink); the true pair count is written to the
static output ``_edge_count``. After a replay the engine reads that count: above the capacity
the edge list was truncated (an overflow), and the cache rebuilds the engine with more room
and re-validates it. The pair search is O(N^2) in memory (constant ``[N (N - 1)]`` pair
indices): this engine serves the mid-size range above ``nb_threshold``.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from ..inputs import CallInputs
from .backends import Captured, Outputs
from .base import StaticEngine, with_sink
from .host import EngineHost

SPARE = 1.25
"""Edge capacity = ``SPARE`` x the edge count seen at build (+ ``MIN_SPARE``)."""
MIN_SPARE = 16


def capacity_for(edges: int) -> int:
    return int(math.ceil(edges * SPARE)) + MIN_SPARE


def pair_mask(
    pos: torch.Tensor, batch: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, cutoff: float
) -> torch.Tensor:
    """``[P]`` which candidate pairs are edges (same structure, ``|r_ij| < cutoff``)."""
    dist = (pos[src] - pos[dst]).norm(dim=-1)
    return (batch[src] == batch[dst]) & (dist < cutoff)


PAIR_BYTES = 64
"""Rough bytes per candidate pair (constant indices + in-graph temporaries), for the pre-build budget check."""


def estimated_bytes(num_atoms: int) -> int:
    """Lower estimate of a sparse engine's memory, checked against the budget before anything is allocated."""
    return num_atoms * max(num_atoms - 1, 0) * PAIR_BYTES


class SparseEngine(StaticEngine):
    """Static-buffer engine for a flat batch with an in-graph neighbour list (see the module docstring)."""

    kind = "sparse"

    def __init__(self, host: EngineHost, num_atoms: int, num_graphs: int, forces: bool, capacity: int) -> None:
        super().__init__(host, ("sparse", num_atoms, num_graphs, forces), forces)
        self.num_nodes, self.num_graphs, self.capacity = num_atoms, num_graphs, capacity
        dev = self.device
        idx = torch.arange(num_atoms, device=dev)
        i, j = torch.meshgrid(idx, idx, indexing="ij")
        off = i != j
        self.buffers = {
            "pos": torch.zeros(num_atoms, 3, dtype=self.dtype, device=dev),
            "numbers": torch.zeros(num_atoms, dtype=torch.long, device=dev),
            "batch": torch.zeros(num_atoms, dtype=torch.long, device=dev),
            "src": j[off].contiguous(),
            "dst": i[off].contiguous(),
        }
        self.add_graph_attr_buffer()

    def fn(self) -> Outputs:
        buf = self.buffers
        sink, cap = self.num_nodes, self.capacity
        src, dst = buf["src"], buf["dst"]
        valid = pair_mask(buf["pos"], buf["batch"], src, dst, self.cutoff)
        count = valid.sum()
        slot = torch.cumsum(valid, 0) - 1
        slot = torch.where(valid & (slot < cap), slot, torch.full_like(slot, cap))  # overflow -> dump slot
        fill = torch.full((cap + 1,), sink, dtype=torch.long, device=src.device)
        src_e = fill.scatter(0, slot, torch.where(valid, src, torch.full_like(src, sink)))[:cap]
        dst_e = fill.scatter(0, slot, torch.where(valid, dst, torch.full_like(dst, sink)))[:cap]
        nodes = with_sink(buf["pos"], buf["numbers"], buf["batch"], self.num_graphs)
        out = self.forward(*nodes, torch.stack([src_e, dst_e]))
        out["_edge_count"] = count
        return out

    def load(self, call: CallInputs) -> None:
        buf = self.buffers
        buf["pos"].copy_(call.pos.to(self.dtype))
        buf["numbers"].copy_(call.numbers)
        buf["batch"].copy_(call.batch)
        self.load_graph_attr(call)

    def edge_count(self, call: CallInputs) -> int:
        """Edges ``call`` needs (eager, outside any capture)."""
        buf = self.buffers
        return int(pair_mask(call.pos.to(self.dtype), call.batch, buf["src"], buf["dst"], self.cutoff).sum())

    def overflowed(self) -> int | None:
        """The pair count of the last replay when it exceeded the capacity, else ``None``."""
        count = int(cast(Captured, self.graph).outputs["_edge_count"])  # captured before any replay
        return count if count > self.capacity else None

    def node_index(self, call: CallInputs) -> torch.Tensor:
        return torch.arange(self.num_nodes, device=self.device)
