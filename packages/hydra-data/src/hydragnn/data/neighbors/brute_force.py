"""Shared edge finalisation and the brute-force reference radius graph.

Every backend produces candidate edges ``(source j, target i, integer image offset S)``; the
definition of an edge lives in :func:`finalize_edges` alone, so that backends agree with
:func:`brute_force_radius_graph` bit for bit: the edge vector is
``vec = (pos[j] - pos[i]) + S @ cell`` evaluated element by element in the dtype of ``pos``, and
the edge is kept when ``vec . vec < cutoff ** 2`` (strict).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple, cast

import numpy as np
import torch

from .inputs import GraphInputs, check_inputs, check_max_neighbours, complete_cell

#: Candidate pairs the brute force holds in memory at once.
_CHUNK = 1 << 22
#: Candidate pairs of a group of equal graphs tested at once (one block of broadcast arithmetic:
#: 256 cells of 32 atoms, 27 images, took 57 ms at 2^20 against 176 ms at 2^16 on this CPU).
_GROUP_PAIRS = 1 << 20


def _shift_components(shift_int: torch.Tensor, cell: torch.Tensor) -> list[torch.Tensor]:
    s = shift_int.to(cell.dtype).T.contiguous()
    return [s[0] * cell[:, 0, d] + s[1] * cell[:, 1, d] + s[2] * cell[:, 2, d] for d in range(3)]


class Candidates(NamedTuple):
    """Candidate edges of a search: a superset of the radius graph, unique.

    ``src [E']`` sources, ``dst [E']`` targets, ``shift_int [E', 3]`` integer image offsets and,
    when the search already knows them, ``parts``: the Cartesian offsets ``S @ cell`` as three
    ``[E']`` components computed by the same element-wise formula as :func:`cartesian_shift`
    (so bit for bit the same), which saves :func:`finalize_edges` a gather of every edge's cell.
    ``ordered``: the candidates are already sorted by ``(target, source, shift)``."""

    src: torch.Tensor
    dst: torch.Tensor
    shift_int: torch.Tensor
    parts: list[torch.Tensor] | None = None
    ordered: bool = False


class Edges(NamedTuple):
    """A radius graph: ``edge_index [2, E]`` (source, target), ``edge_shift [E, 3]`` Cartesian
    image offsets (zeros without a cell), ``length2 [E]``, the squared edge lengths in the dtype
    of ``pos`` (detached; zero for self loops), and ``shift_int [E, 3]`` int64, the integer image
    offsets (``edge_shift`` is :func:`cartesian_shift` of them)."""

    edge_index: torch.Tensor
    edge_shift: torch.Tensor
    length2: torch.Tensor
    shift_int: torch.Tensor


def cartesian_shift(shift_int: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """Cartesian image offsets ``S @ cell``, element by element (no BLAS, reproducible).

    Args:
        shift_int: ``[E, 3]`` integer image offsets.
        cell: ``[E, 3, 3]`` or ``[1, 3, 3]`` cell of each edge (rows are lattice vectors).

    Returns:
        ``[E, 3]`` offsets in the dtype of ``cell``.
    """
    return torch.stack(_shift_components(shift_int, cell), dim=1)


def _edge_cells(inputs: GraphInputs, dst: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    return cell if cell.shape[0] == 1 else cell.index_select(0, inputs.batch.index_select(0, dst))


def edge_geometry(
    inputs: GraphInputs,
    src: torch.Tensor,
    dst: torch.Tensor,
    shift_int: torch.Tensor,
    parts: list[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor] | None, torch.Tensor]:
    """Cartesian shifts and squared lengths ``|pos[src] - pos[dst] + S @ cell|^2`` of edges.

    Computed component by component with plain multiplications and additions, so the result
    for an edge does not depend on how many edges are processed together.

    Args:
        inputs: Checked inputs (positions are detached).
        src: ``[E]`` source (neighbour) indices.
        dst: ``[E]`` target (centre) indices.
        shift_int: ``[E, 3]`` integer image offsets.
        parts: the Cartesian offsets by component when the caller has them (:class:`Candidates`).

    Returns:
        The detached shifts as three ``[E]`` components (``None`` without a cell) and ``[E]``
        squared lengths, all in the dtype of ``pos``.
    """
    pos_t = inputs.pos.T.contiguous()
    vec = [pos_t[d].index_select(0, src) - pos_t[d].index_select(0, dst) for d in range(3)]
    if inputs.cell is None:
        parts = None
    else:
        if parts is None:
            parts = _shift_components(shift_int, _edge_cells(inputs, dst, inputs.cell.detach()))
        vec = [v + p for v, p in zip(vec, parts, strict=True)]
    return parts, vec[0] * vec[0] + vec[1] * vec[1] + vec[2] * vec[2]


def _stable_argsort(key: torch.Tensor) -> torch.Tensor:
    if key.device.type == "cpu":  # numpy's stable sort is much faster on the nearly sorted keys seen here
        return torch.from_numpy(np.argsort(key.numpy(), kind="stable"))
    return torch.sort(key, stable=True).indices


def canonical_order(src: torch.Tensor, dst: torch.Tensor, shift_int: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Permutation sorting edges by ``(target, source, shift)``, shift compared lexicographically.

    Args:
        src: ``[E]`` int64 sources.
        dst: ``[E]`` int64 targets.
        shift_int: ``[E, 3]`` int64 image offsets.
        num_nodes: Number of atoms ``N``.

    Returns:
        ``[E]`` int64 permutation.
    """
    if src.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=src.device)
    shift_int = shift_int.long()
    half = int(shift_int.abs().max())
    base = 2 * half + 1
    s = shift_int + half
    shift_key = (s[:, 0] * base + s[:, 1]) * base + s[:, 2]
    pair_key = dst * max(num_nodes, 1) + src
    images = base**3
    if max(num_nodes, 1) ** 2 * images < 2**62:  # one sort of unique keys
        return _stable_argsort(pair_key * images + shift_key)
    order = _stable_argsort(shift_key)
    return order[_stable_argsort(pair_key[order])]


def finalize_edges(inputs: GraphInputs, candidates: Candidates, max_neighbours: int | None, self_loops: bool) -> Edges:
    """Turn a superset of candidate edges into the radius graph (the one definition of an edge).

    Drops candidates at distance >= cutoff and zero-offset self pairs, keeps the ``k`` nearest
    neighbours of each centre when asked (ties by source index, then offset), adds self loops
    when asked (they do not count towards ``k``) and sorts by ``(target, source, shift)``.
    Candidates must be unique.

    Args:
        inputs: Checked inputs.
        candidates: the search's candidates (integer offsets are zeros for non-periodic graphs).
        max_neighbours: ``None`` or ``k >= 1``.
        self_loops: Add ``(i, i)`` edges with zero offset.

    Returns:
        ``edge_index [2, E]`` int64 (row 0 source, row 1 target), ``edge_shift [E, 3]`` in the
        dtype of ``pos`` (differentiable with respect to ``cell`` when it requires grad) and the
        squared lengths.
    """
    n, device = inputs.pos.shape[0], inputs.pos.device
    src, dst, shift_int = candidates.src.long(), candidates.dst.long(), candidates.shift_int  # any integer dtype
    parts, d2 = edge_geometry(inputs, src, dst, shift_int, candidates.parts)
    keep = d2 < inputs.cutoff * inputs.cutoff
    same = (src == dst).nonzero().squeeze(1)  # a zero-offset self pair is no edge
    keep[same[(shift_int.index_select(0, same) == 0).all(dim=1)]] = False
    kept = keep.nonzero().squeeze(1)
    if candidates.ordered:
        order = torch.arange(kept.numel(), device=device)
    else:
        order = canonical_order(src[kept], dst[kept], shift_int[kept], n)
    if max_neighbours is not None and order.numel():
        kept_d2, by_dst = d2[kept], dst[kept]
        by_distance = order[_stable_argsort(kept_d2[order])]
        by_distance = by_distance[_stable_argsort(by_dst[by_distance])]  # (target, d2, source, shift)
        counts = torch.bincount(by_dst, minlength=n)
        start = torch.cumsum(counts, 0) - counts
        rank = torch.arange(by_distance.numel(), device=device) - start[by_dst[by_distance]]
        chosen = torch.zeros(kept.numel(), dtype=torch.bool, device=device)
        chosen[by_distance[rank < max_neighbours]] = True
        order = order[chosen[order]]
    final = kept if candidates.ordered and max_neighbours is None else kept[order]
    src, dst, shift_int, d2 = src[final], dst[final], shift_int[final].long(), d2[final]
    shift = None if parts is None else torch.stack([p[final] for p in parts], dim=1)
    if self_loops and n:
        atoms = torch.arange(n, device=device)
        src, dst = torch.cat([src, atoms]), torch.cat([dst, atoms])
        shift_int = torch.cat([shift_int, torch.zeros(n, 3, dtype=torch.long, device=device)])
        order = canonical_order(src, dst, shift_int, n)
        src, dst, shift_int = src[order], dst[order], shift_int[order]
        d2 = torch.cat([d2, torch.zeros(n, dtype=d2.dtype, device=device)])[order]
        if shift is not None:
            shift = torch.cat([shift, torch.zeros(n, 3, dtype=shift.dtype, device=device)])[order]
    edge_index = torch.stack([src, dst])
    if inputs.cell is None:
        return Edges(edge_index, torch.zeros(src.numel(), 3, dtype=inputs.pos.dtype, device=device), d2, shift_int)
    if inputs.cell.requires_grad:  # recompute through the cell so that stress can flow
        return Edges(edge_index, cartesian_shift(shift_int, _edge_cells(inputs, dst, inputs.cell)), d2, shift_int)
    return Edges(edge_index, cast(torch.Tensor, shift), d2, shift_int)  # with a cell, edge_geometry gives the shifts


def image_ranges(inputs: GraphInputs, full: torch.Tensor) -> torch.Tensor:
    """Per-graph bound ``R`` such that every edge has ``|S_k| <= R_k`` (zero when not periodic).

    Args:
        inputs: Checked inputs.
        full: ``[B, 3, 3]`` float64 completed cells (:func:`complete_cell`).

    Returns:
        ``[B, 3]`` int64 bounds.
    """
    b = inputs.num_graphs
    recip = torch.linalg.inv(full).transpose(1, 2).norm(dim=-1)  # [B, 3] |b_k| = 1 / plane spacing
    frac = (inputs.pos.to(torch.float64).unsqueeze(1) @ torch.linalg.inv(full)[inputs.batch]).squeeze(1)
    index = inputs.batch.unsqueeze(1).expand_as(frac)
    lo = torch.full((b, 3), math.inf, dtype=torch.float64, device=frac.device).scatter_reduce(0, index, frac, "amin")
    hi = torch.full((b, 3), -math.inf, dtype=torch.float64, device=frac.device).scatter_reduce(0, index, frac, "amax")
    span = torch.where(torch.isfinite(hi - lo), hi - lo, torch.zeros_like(lo))
    # |S_k| < cutoff |b_k| + span_k exactly; the slack covers rounding of vec in the dtype of pos.
    rounding = 16 * torch.finfo(inputs.pos.dtype).eps * (float(inputs.pos.abs().max()) + inputs.cutoff) * recip
    bound = torch.floor(inputs.cutoff * recip + span + rounding + 1e-6).long()
    return torch.where(inputs.pbc, bound, torch.zeros_like(bound))


def brute_force_radius_graph(
    pos: torch.Tensor,
    cutoff: float,
    batch: torch.Tensor | None = None,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | None = None,
    max_neighbours: int | None = None,
    self_loops: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference radius graph: every pair in every periodic image, pure torch, O(N^2 * images).

    Same signature, output convention and errors as
    :func:`hydragnn.data.neighbors.radius_graph`; meant for tests and small systems.

    Args:
        pos: ``[N, 3]`` float32 or float64 positions.
        cutoff: Cutoff radius (> 0); pairs at distance < cutoff are edges.
        batch: ``[N]`` sorted int64 graph index, or ``None`` for one graph.
        cell: ``[3, 3]`` or ``[B, 3, 3]`` cells (rows are lattice vectors), or ``None``.
        pbc: ``[3]`` or ``[B, 3]`` bool, or ``None`` (all True with a cell).
        max_neighbours: Keep only the ``k`` nearest neighbours of each centre.
        self_loops: Add ``(i, i)`` edges with zero shift.

    Returns:
        ``edge_index [2, E]`` int64 (source j, target i) and ``edge_shift [E, 3]`` such that
        ``pos[j] - pos[i] + edge_shift`` is the edge vector.
    """
    inputs = check_inputs(pos, cutoff, batch, cell, pbc)
    k = check_max_neighbours(max_neighbours)
    edges = finalize_edges(inputs, brute_force_candidates(inputs), k, self_loops)
    return edges.edge_index, edges.edge_shift


def _graph_images(inputs: GraphInputs) -> tuple[list[int], list[list[int]]]:
    """Atoms per graph and the periodic image range of each graph (zeros when not periodic)."""
    counts = torch.bincount(inputs.batch, minlength=inputs.num_graphs).tolist()
    return counts, image_ranges(inputs, complete_cell(inputs)).tolist()


def brute_force_pairs(inputs: GraphInputs) -> int:
    """How many candidate pairs :func:`brute_force_candidates` tests: sum over graphs of
    atoms^2 times periodic images."""
    counts, ranges = _graph_images(inputs)
    return sum(n * n * math.prod(2 * r + 1 for r in rng) for n, rng in zip(counts, ranges, strict=True))


def brute_force_candidates(inputs: GraphInputs) -> Candidates:
    """Unique candidate pairs ``(src, dst, S)`` of a graph in every periodic image within its
    range, with their Cartesian offsets: every pair closer than the cutoff and a few within
    rounding of it, which :func:`finalize_edges` (the exact test) drops.

    Graphs with the same atom count and image ranges are searched together: their positions as
    one ``[G, n, 3]`` block and their image offsets as ``[G, M, 3]``, the squared lengths of all
    ``G n^2 M`` pairs from one batched float32 matrix product (no per-pair gather), about
    :data:`_GROUP_PAIRS` pairs at a time, large graphs a slice of centres at a time."""
    device = inputs.pos.device
    counts, ranges = _graph_images(inputs)
    starts = [0, *itertools.accumulate(counts)][:-1]
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for g, count in enumerate(counts):
        if count:
            groups.setdefault((count, tuple(ranges[g])), []).append(starts[g])
    cell = None if inputs.cell is None else inputs.cell.detach()
    blocks: list[Candidates] = []
    for (count, rng), firsts in groups.items():
        small = max(rng) < 127  # image offsets as int8: a quarter of the candidates' bytes
        axes = [torch.arange(-r, r + 1, device=device, dtype=torch.int8 if small else torch.long) for r in rng]
        images = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
        per_centre = count * images.shape[0]
        graphs = max(1, _GROUP_PAIRS // (count * per_centre))
        centres = count if graphs > 1 else max(1, min(count, _CHUNK // per_centre))
        first_all = torch.tensor(firsts, device=device)
        for g0 in range(0, len(firsts), graphs):
            first = first_all[g0 : g0 + graphs]
            for c0 in range(0, count, centres):
                blocks.append(_near_block(inputs, cell, first, count, c0, min(centres, count - c0), images))
    if not blocks:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Candidates(empty, empty, torch.zeros(0, 3, dtype=torch.long, device=device))
    parts = None if cell is None else [torch.cat([b.parts[d] for b in blocks if b.parts]) for d in range(3)]
    src, dst, shift_int = (torch.cat(t) for t in zip(*(b[:3] for b in blocks), strict=True))
    # one group: blocks follow graphs and centres in order, each block in (centre, source, image) order
    return Candidates(src, dst, shift_int, parts, ordered=len(groups) == 1)


def _near_block(
    inputs: GraphInputs,
    cell: torch.Tensor | None,
    first: torch.Tensor,
    count: int,
    c0: int,
    centres: int,
    images: torch.Tensor,
) -> Candidates:
    """Candidates among centres ``c0 .. c0 + centres`` of the graphs starting at atoms ``first``
    (``[G]``, ``count`` atoms each), every source and image: a superset of the pairs closer than
    the cutoff, with their Cartesian offsets (computed once per graph and image).

    Squared lengths come from one batched float32 matrix product, ``|x|^2 + |y|^2 - 2 x.y`` with
    ``x`` a centre and ``y`` a source in image ``S`` (positions taken relative to each graph's
    first atom, so the terms stay small), and pairs are kept up to a rounding margin of the
    terms' size, many float32 epsilons: the exact test is :func:`finalize_edges`'s."""
    local = torch.arange(count, device=first.device)
    src_atoms = first.unsqueeze(1) + local  # [G, n]
    rel = inputs.pos.detach()[src_atoms]
    rel = (rel - rel[:, :1]).to(torch.float32)  # [G, n, 3]
    x = rel[:, c0 : c0 + centres]  # [G, c, 3]
    n_graphs, n_images = first.shape[0], images.shape[0]
    parts: list[torch.Tensor] | None = None
    if cell is None:
        y = rel
    else:
        graph_cells = cell if cell.shape[0] == 1 else cell.index_select(0, inputs.batch.index_select(0, first))
        s = images.to(cell.dtype)  # the formula of _shift_components, per graph and image: [G, M] each
        parts = [
            (
                s[:, 0] * graph_cells[:, 0, d, None]
                + s[:, 1] * graph_cells[:, 1, d, None]
                + s[:, 2] * graph_cells[:, 2, d, None]
            )
            .expand(n_graphs, n_images)
            .reshape(-1)
            for d in range(3)
        ]
        offsets = torch.stack(parts, dim=1).reshape(n_graphs, n_images, 3).to(torch.float32)
        y = (rel.unsqueeze(2) + offsets.unsqueeze(1)).reshape(n_graphs, -1, 3)  # [G, n M, 3]
    xx, yy = (x * x).sum(-1), (y * y).sum(-1)
    cutoff2 = inputs.cutoff * inputs.cutoff
    margin = 64 * torch.finfo(torch.float32).eps * (float(xx.max()) + float(yy.max()) + cutoff2)
    # |x|^2 + |y|^2 - 2 x.y < bound, with |x|^2 moved to the right-hand side: one full-size pass fewer
    near = torch.baddbmm(yy.unsqueeze(1).expand(-1, x.shape[1], -1), x, y.transpose(1, 2), alpha=-2.0)
    g, i, jm = (near < (cutoff2 + margin) - xx.unsqueeze(2)).nonzero(as_tuple=True)
    image = jm % n_images
    if parts is not None:
        at = g * n_images + image
        parts = [p.index_select(0, at) for p in parts]
    start = first.index_select(0, g)
    return Candidates(start + jm // n_images, start + (c0 + i), images.index_select(0, image), parts)
