"""How many edges a call will build, estimated before the neighbour search allocates them.

Memory of a call grows with its edges (neighbour pairs within the cutoff): the neighbour list,
the edge features of every layer, and for forces their saved activations. A structure far denser
than matter (8,000 atoms in an 8 Å cube) or very large would otherwise end in the allocator's
own error, or the kernel's out-of-memory kill, after minutes. :func:`estimated_edges` reads the
number density of each structure (atoms per cell volume; a molecule's or cluster's bounding box
grown by half a cutoff, at least one cutoff wide per direction) and counts ``N * min(density * 4/3 pi r_c^3, cap)`` edges,
the cap being ``max_neighbours`` (when given) and, without a cell, ``N - 1``. The calculator
refuses a call whose uncapped estimate passes its ``max_edges`` (:data:`DEFAULT_MAX_EDGES`),
naming both numbers: the neighbour search lists every pair within the cutoff before a model's
``max_neighbours`` keeps the nearest, so the cap does not bound its memory.
"""

from __future__ import annotations

import math

import torch

__all__ = ["DEFAULT_MAX_EDGES", "estimated_edges"]

DEFAULT_MAX_EDGES = 20_000_000
"""Edges one call may build by default (a 100,000-atom metal at 5 Å has about 8 million; each
edge holds a few hundred bytes to a few KB of features, more with forces)."""


def estimated_edges(
    pos: torch.Tensor,
    batch: torch.Tensor,
    num_graphs: int,
    cell: torch.Tensor | None,
    pbc: torch.Tensor | None,
    cutoff: float,
    max_neighbours: int | None,
) -> list[int]:
    """Estimated directed edges of each structure of a call (see the module docstring).

    Args:
        pos: ``[N, 3]``; batch: ``[N]`` structure of each atom (sorted); num_graphs: B.
        cell: ``[B, 3, 3]`` rows, or ``None``; pbc: ``[B, 3]`` or ``None``.
        cutoff: Å; max_neighbours: the model's cap, or ``None``.
    """
    counts = torch.bincount(batch, minlength=num_graphs).tolist()
    sphere = 4.0 / 3.0 * math.pi * cutoff**3
    lo = torch.full((num_graphs, 3), math.inf, dtype=pos.dtype, device=pos.device)
    hi = torch.full((num_graphs, 3), -math.inf, dtype=pos.dtype, device=pos.device)
    index = batch.unsqueeze(-1).expand(-1, 3)
    lo = lo.scatter_reduce(0, index, pos, "amin")
    hi = hi.scatter_reduce(0, index, pos, "amax")
    # a cluster's atoms near its surface have fewer neighbours: half a cutoff of padding on each side
    extent = (hi - lo + 0.5 * cutoff).clamp_min(cutoff).double().cpu()
    volumes = extent.prod(dim=1).tolist()
    periodic = [False] * num_graphs
    if cell is not None:
        cell_volumes = torch.linalg.det(cell.double()).abs().cpu().tolist()
        flags = pbc.any(dim=1).tolist() if pbc is not None else [True] * num_graphs
        for b in range(num_graphs):
            if flags[b] and cell_volumes[b] > 0:
                volumes[b], periodic[b] = cell_volumes[b], True
    edges = []
    for b in range(num_graphs):
        n = counts[b]
        neighbours = n / volumes[b] * sphere
        if not periodic[b]:
            neighbours = min(neighbours, max(n - 1, 0))
        if max_neighbours is not None:
            neighbours = min(neighbours, max_neighbours)
        edges.append(int(n * neighbours))
    return edges
