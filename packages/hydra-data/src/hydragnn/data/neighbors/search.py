"""Radius graphs with nvalchemi-toolkit-ops: periodic (any triclinic cell), batched, float32/64.

The candidate pairs come from nvalchemi's batched naive or cell-list kernels (Warp, on CPU or
CUDA), called through its core Warp launchers on torch buffers (:mod:`.warp`), so the
first call of a process imports ``nvalchemiops.neighbors`` only, not the torch adapters' package
with its optimiser and integrator kernels. nvalchemi fills a fixed-width neighbour matrix and
*silently* truncates rows that do not fit, while its ``num_neighbors`` still reports the true
counts: :func:`radius_graph` compares the two and reruns the search (not the cell-list build)
with a wider matrix, so no pair is ever dropped. Candidates are searched with a
slightly enlarged cutoff and then filtered with the exact distance in the dtype of ``pos`` by the
same code as :func:`brute_force_radius_graph` (see :mod:`.brute_force`), so both give the
same edges, including float32 pairs right at the cutoff.

Conventions (PyG ``source_to_target``)::

    edge_index[0] = j (neighbour, source), edge_index[1] = i (centre, target)
    vec = pos[j] - pos[i] + edge_shift          # |vec| < cutoff

Small searches skip nvalchemi: when the brute force would test at most
:data:`BRUTE_FORCE_MAX_PAIRS` candidate pairs (atoms^2 times periodic images, summed over the
graphs; a few hundred molecules, one small cell), or on CPU when every graph has fewer than
:data:`BRUTE_FORCE_MAX_ATOMS` atoms (where nvalchemi's naive kernel would test the same pairs),
the candidates come from :func:`~.brute_force.brute_force_candidates` in torch. The edges are
the same (the one definition is ``finalize_edges``); what it saves is Warp's start-up in a
process (1.2-1.6 s on this CPU at the first call) and its launch cost on a few atoms.

Edges are sorted by ``(target, source, shift)``. An atom's own periodic image (``i == j`` with a
non-zero shift) is an edge; ``i == j`` with a zero shift is one only with ``self_loops=True``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from ..errors import NeighborListError
from ..validation import DEFAULT_MAX_CELL_IMAGES, check_cell_size
from .brute_force import (
    Candidates,
    Edges,
    brute_force_candidates,
    brute_force_pairs,
    brute_force_radius_graph,
    finalize_edges,
)
from .inputs import GraphInputs, check_inputs, check_max_neighbours, complete_cell
from .warp import neighbour_search

__all__ = [
    "ManyEdges",
    "add_edges",
    "add_edges_many",
    "brute_force_radius_graph",
    "radius_edges",
    "radius_graph",
    "search_many",
]

#: Graphs with at least this many atoms make the whole batch use the cell-list method (O(N));
#: below it the naive O(N^2) kernel is faster on CPU.
CELL_LIST_MIN_ATOMS = 256
#: Searches testing at most this many candidate pairs by brute force run in torch, without
#: nvalchemi (~50 ms at the bound on one CPU thread; 256 molecules of 3-12 atoms are ~15,000).
BRUTE_FORCE_MAX_PAIRS = 1 << 20
#: On CPU, a batch whose graphs all have fewer atoms than this runs in torch whatever its size,
#: which skips Warp's start-up in the process. nvalchemi's naive kernel tests the same pairs;
#: per search with edges (one thread pool of 2, cutoff 5 Å, fcc cells): 32 atoms x 256
#: 64 ms in torch / 93 ms in nvalchemi, 48 x 256 109 / 133, 72 x 128 94 / 102, 108 x 64
#: 129 / 78. On a GPU one kernel per search beats torch's launches.
BRUTE_FORCE_MAX_ATOMS = 64
#: Testing hook: force the initial width of nvalchemi's neighbour matrix (``None``: estimate).
_INITIAL_MAX_NEIGHBOURS: int | None = None
#: nvalchemi calls made by the last :func:`radius_graph` (1 unless the buffer had to grow).
_last_attempts = 0


def _round_up(value: int, multiple: int = 8) -> int:
    return max(multiple, -(-value // multiple) * multiple)


def _search_frame(inputs: GraphInputs, graphs: torch.Tensor, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and cells handed to nvalchemi: every atom inside its cell along non-periodic directions.

    Non-periodic rows of each (completed) cell become the orthonormal complement of the
    periodic rows, scaled to the extent of the graph plus padding, and the graph is translated
    along them; translations and these rows change no pair and no periodic image offset.

    Returns:
        ``[N, 3]`` float64 positions and ``[B', 3, 3]`` float64 cells of the non-empty graphs.
    """
    full = complete_cell(inputs)[graphs]
    pbc = inputs.pbc[graphs].unsqueeze(-1)
    pos = inputs.pos.to(torch.float64)
    proj = torch.einsum("nd,nkd->nk", pos, full[batch])
    index = batch.unsqueeze(1).expand_as(proj)
    lo = torch.full_like(full[:, :, 0], math.inf).scatter_reduce(0, index, proj, "amin")
    hi = torch.full_like(full[:, :, 0], -math.inf).scatter_reduce(0, index, proj, "amax")
    pad = 0.1 * inputs.cutoff + 1e-6 * (hi.abs() + lo.abs())
    origin = torch.where(pbc, 0.0, ((lo - pad).unsqueeze(-1) * full)).sum(dim=1)  # [B', 3]
    cell = torch.where(pbc, full, full * (hi - lo + 2 * pad).unsqueeze(-1))
    return pos - origin[batch], cell


def _initial_width(cell: torch.Tensor, pbc: torch.Tensor, counts: torch.Tensor, cutoff: float) -> int:
    """Neighbour-matrix width from the atom density (twice the mean count, plus 8).

    Args:
        cell: ``[B, 3, 3]`` search cells (non-periodic rows span the graph's extent).
        pbc: ``[B, 3]`` bool flags.
        counts: ``[B]`` float64 atoms per graph.
        cutoff: Search cutoff.

    Returns:
        The width, a multiple of 8; never more than ``n - 1`` for a graph without periodicity.
    """
    if _INITIAL_MAX_NEIGHBOURS is not None:
        return int(_INITIAL_MAX_NEIGHBOURS)
    lengths = cell.norm(dim=-1)
    # Density in a slab no thinner than the cutoff sphere along non-periodic directions.
    volume = torch.linalg.det(cell).abs() * torch.where(pbc, 1.0, (2 * cutoff / lengths).clamp_min(1.0)).prod(dim=1)
    estimate = torch.ceil(2.0 * counts / volume * (4.0 / 3.0) * math.pi * cutoff**3) + 8
    estimate = torch.where(pbc.any(dim=1), estimate, torch.minimum(estimate, counts - 1.0))
    return _round_up(int(estimate.max()))


def _nvalchemi_candidates(inputs: GraphInputs) -> Candidates:
    """Candidate edges ``(src, dst, S)`` from nvalchemi, a superset of the radius graph."""
    global _last_attempts
    pos, dtype, device = inputs.pos, inputs.pos.dtype, inputs.pos.device
    counts = torch.bincount(inputs.batch, minlength=inputs.num_graphs)
    graphs = (counts > 0).nonzero().flatten()
    batch = (torch.cumsum(counts > 0, 0) - 1)[inputs.batch]  # graphs without atoms removed
    counts = counts[graphs]
    search_pos, cell = _search_frame(inputs, graphs, batch)
    pbc = inputs.pbc[graphs]
    # Search a little beyond the cutoff so float rounding inside the kernels cannot lose a pair.
    eps = torch.finfo(dtype).eps
    scale = float(pos.abs().max() + search_pos.abs().max() + cell.norm(dim=-1).sum(dim=1).max()) + inputs.cutoff
    search_cutoff = inputs.cutoff * (1 + 1e-6) + 64 * eps * scale
    width = _initial_width(cell, pbc, counts.to(torch.float64), search_cutoff)
    ptr = torch.zeros(graphs.numel() + 1, dtype=torch.int32, device=device)
    ptr[1:] = torch.cumsum(counts, 0)
    max_atoms = int(counts.max())
    search = neighbour_search(
        search_pos.to(dtype).contiguous(),
        cell.to(dtype).contiguous(),
        pbc.contiguous(),
        batch.to(torch.int32).contiguous(),
        ptr,
        search_cutoff,
        max_atoms,
        cell_list=max_atoms >= CELL_LIST_MIN_ATOMS,
    )
    found = 0
    for attempt in range(1, 4):
        _last_attempts = attempt
        matrix, num, shifts = search(width)
        found = int(num.max())
        if found <= width:
            break
        width = _round_up(found)  # num_neighbors holds the true counts: one more call is enough
    else:  # pragma: no cover - nvalchemi reports exact counts, so the second call always fits
        raise RuntimeError(f"nvalchemi neighbour matrix still overflows at width {width} (found {found})")
    slots = torch.arange(width, device=device)
    dst, slot = (slots.unsqueeze(0) < num.unsqueeze(1)).nonzero(as_tuple=True)
    return Candidates(matrix[dst, slot].long(), dst, shifts[dst, slot].long())


def radius_graph(
    pos: torch.Tensor,
    cutoff: float,
    batch: torch.Tensor | None = None,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | None = None,
    max_neighbours: int | None = None,
    self_loops: bool = False,
    max_cell_images: int = DEFAULT_MAX_CELL_IMAGES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All pairs closer than ``cutoff``, with periodic images, for one graph or a batch.

    Args:
        pos: ``[N, 3]`` float32 or float64 positions. May require grad: the result is built from
            a detached copy, so ``pos[src] - pos[dst] + edge_shift`` stays differentiable.
        cutoff: Cutoff radius (> 0); pairs at distance < cutoff (strict) are edges.
        batch: ``[N]`` int64 graph index, sorted (PyG convention); ``None`` for one graph.
        cell: ``[3, 3]`` (shared) or ``[B, 3, 3]`` cells, rows are lattice vectors (ASE
            convention); ``None`` for non-periodic graphs. In a batch mixing periodic and
            non-periodic graphs, give every graph a cell and set ``pbc`` False for the latter.
            Rows of non-periodic directions are not used (they may be zero).
        pbc: ``[3]`` or ``[B, 3]`` bool; ``None`` with a cell means periodic in all directions.
        max_neighbours: ``None`` keeps every neighbour; ``k`` keeps the ``k`` nearest of each
            centre (ties broken by source index, then shift), deterministically.
        self_loops: Add one ``(i, i)`` edge with zero shift per atom (not counted in ``k``).
        max_cell_images: periodic images allowed per direction; a cell needing more is too small
            for the cutoff (:func:`hydragnn.data.validation.check_cell_size`).

    Returns:
        ``edge_index [2, E]`` int64 (``edge_index[0]`` source j, ``edge_index[1]`` target i) and
        ``edge_shift [E, 3]`` in the dtype of ``pos``: the Cartesian image offset ``S @ cell``
        (zeros without a cell), differentiable with respect to ``cell`` if it requires grad.
        Edges are sorted by ``(target, source, shift)``.

    Raises:
        NeighborListError: Wrong shapes or dtypes, NaN/inf positions or cells, non-positive
            cutoff, singular periodic cell, unsorted or wrong-length ``batch``, fewer cells than
            graphs, bad ``max_neighbours``.
        StructureError: a periodic cell too small for the cutoff.
    """
    edges = radius_edges(pos, cutoff, batch, cell, pbc, max_neighbours, self_loops, max_cell_images)
    return edges.edge_index, edges.edge_shift


def radius_edges(
    pos: torch.Tensor,
    cutoff: float,
    batch: torch.Tensor | None,
    cell: torch.Tensor | None,
    pbc: torch.Tensor | None,
    max_neighbours: int | None,
    self_loops: bool,
    max_cell_images: int = DEFAULT_MAX_CELL_IMAGES,
) -> Edges:
    """:func:`radius_graph`, with the squared edge lengths (:class:`~.brute_force.Edges`)."""
    inputs = check_inputs(pos, cutoff, batch, cell, pbc)
    if inputs.cell is not None:
        check_cell_size(inputs.cell, inputs.pbc, inputs.cutoff, max_cell_images)
    k = check_max_neighbours(max_neighbours)
    if inputs.pos.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.long, device=inputs.pos.device)
        shifts = torch.zeros(0, 3, dtype=torch.long, device=empty.device)
        return finalize_edges(inputs, Candidates(empty, empty, shifts), k, self_loops)
    candidates = brute_force_candidates(inputs) if _brute_force(inputs) else _nvalchemi_candidates(inputs)
    return finalize_edges(inputs, candidates, k, self_loops)


def _brute_force(inputs: GraphInputs) -> bool:
    """Whether the torch brute force searches ``inputs`` (:data:`BRUTE_FORCE_MAX_PAIRS`,
    :data:`BRUTE_FORCE_MAX_ATOMS`); otherwise nvalchemi does."""
    if inputs.pos.device.type == "cpu":
        largest = int(torch.bincount(inputs.batch, minlength=inputs.num_graphs).max())
        if largest < BRUTE_FORCE_MAX_ATOMS:
            return True
    return brute_force_pairs(inputs) <= BRUTE_FORCE_MAX_PAIRS


def add_edges(data: Data, cutoff: float, max_neighbours: int | None = None) -> Data:
    """Shallow copy of a PyG ``Data``/``Batch`` with ``edge_index`` (and ``edge_shift``) rebuilt.

    Reads ``data.pos [N, 3]``, and when present ``data.cell`` (``[1, 3, 3]`` or ``[3, 3]`` for one
    graph, ``[B, 3, 3]`` in a ``Batch``), ``data.pbc`` (``[3]``, ``[1, 3]`` or ``[B, 3]``) and
    ``data.batch``. ``edge_shift [E, 3]`` is set when ``data`` has a cell and removed otherwise.
    The derived edge tensors of :func:`hydragnn.data.prepare` (``edge_attr``, ``edge_output``)
    describe the old edges: their presence is an error (build edges before preparing a schema
    with edge variables); other edge-level source attributes are yours to recompute.

    Args:
        data: Graph or batch of graphs with positions.
        cutoff: Cutoff radius (> 0).
        max_neighbours: Keep only the ``k`` nearest neighbours of each centre.

    Returns:
        A new ``Data``/``Batch`` sharing every other tensor with ``data``.

    Raises:
        NeighborListError: ``data`` has no ``pos``, carries derived edge tensors of the old
            edges, or any input is malformed.
    """
    pos = _checked_pos(data, "add_edges")
    cell = getattr(data, "cell", None)
    batch = getattr(data, "batch", None)
    edge_index, edge_shift = radius_graph(pos, cutoff, batch, cell, getattr(data, "pbc", None), max_neighbours)
    return _with_edges(data, edge_index, edge_shift if cell is not None else None)


def _checked_pos(data: Data, where: str) -> torch.Tensor:
    """``data.pos``, after refusing data whose derived edge tensors would outlive its edges."""
    stale = [key for key in ("edge_attr", "edge_output") if key in data]
    if stale:
        raise NeighborListError(
            f"{where}: data carries {stale}, derived from its current edges; rebuilding edges would "
            "leave them describing edges that no longer exist. Build edges before prepare()."
        )
    pos = getattr(data, "pos", None)
    if pos is None:
        raise NeighborListError(f"{where}: expected data with a 'pos' attribute [N, 3], found keys {list(data.keys())}")
    return pos


def _with_edges(data: Data, edge_index: torch.Tensor, edge_shift: torch.Tensor | None) -> Data:
    out = copy.copy(data)
    out.edge_index = edge_index
    if edge_shift is not None:
        out.edge_shift = edge_shift
    elif "edge_shift" in out:
        del out.edge_shift
    return out


@dataclass(frozen=True)
class ManyEdges:
    """The edges of many single graphs from one search (:func:`search_many`), before they are
    split back into the graphs (:meth:`split`).

    ``pos [N, 3]``, ``batch [N]``, ``edge_index [2, E]``, ``edge_shift [E, 3]`` (``None`` when
    no graph has a cell) and ``length2 [E]`` (squared edge lengths) are those of the graphs laid
    end to end; edges are sorted by target, so each graph's edges are one contiguous range
    (``per_graph`` edges each)."""

    graphs: Sequence[Data]
    pos: torch.Tensor
    batch: torch.Tensor
    edge_index: torch.Tensor
    edge_shift: torch.Tensor | None
    length2: torch.Tensor
    periodic: list[bool]
    counts: torch.Tensor
    per_graph: list[int]

    def split(self) -> list[Data]:
        """One shallow copy of each graph with its edges (as :func:`add_edges` gives them)."""
        start = torch.zeros(len(self.graphs) + 1, dtype=torch.long, device=self.pos.device)
        start[1:] = torch.cumsum(self.counts, 0)
        out, first = [], 0
        for k, (graph, n) in enumerate(zip(self.graphs, self.per_graph)):
            index = self.edge_index[:, first : first + n] - start[k]
            shift = self.edge_shift[first : first + n] if self.periodic[k] and self.edge_shift is not None else None
            out.append(_with_edges(graph, index, shift))
            first += n
        return out

    def shortest(self) -> torch.Tensor:
        """``[B]`` length of each graph's shortest edge (``inf`` for a graph without edges), from
        the squared lengths the search computed."""
        d2 = self.length2
        out = torch.full((len(self.graphs),), torch.inf, dtype=d2.dtype, device=d2.device)
        return out.scatter_reduce(0, self.batch[self.edge_index[1]], d2, "amin").sqrt()


def search_many(graphs: Sequence[Data], cutoff: float, max_neighbours: int | None = None) -> ManyEdges:
    """The edges of many single graphs (each a ``Data`` with ``pos``, optional ``cell``
    ``[1, 3, 3]`` / ``[3, 3]`` and ``pbc``; positions of one dtype and device) from one search,
    periodic and non-periodic mixed.

    Raises:
        NeighborListError, StructureError: as :func:`radius_graph`, for the batch as a whole.
    """
    positions = [_checked_pos(g, "add_edges_many") for g in graphs]
    pos = torch.cat(positions)
    counts = torch.tensor([p.shape[0] for p in positions], device=pos.device)
    batch = torch.repeat_interleave(torch.arange(len(graphs), device=pos.device), counts)
    periodic = [getattr(g, "cell", None) is not None for g in graphs]
    cell = pbc = None
    if any(periodic):
        zeros = torch.zeros(3, 3, dtype=pos.dtype, device=pos.device)
        cell = torch.stack([g.cell.reshape(3, 3).to(pos.dtype) if has else zeros for g, has in zip(graphs, periodic)])
        pbc = torch.stack([_pbc_of(g, has, pos.device) for g, has in zip(graphs, periodic)])
    edge_index, edge_shift, length2, _ = radius_edges(pos, cutoff, batch, cell, pbc, max_neighbours, False)
    per_graph = torch.bincount(batch[edge_index[1]], minlength=len(graphs)).tolist()  # edges sorted by target
    shift = edge_shift if cell is not None else None
    return ManyEdges(graphs, pos, batch, edge_index, shift, length2, periodic, counts, per_graph)


def add_edges_many(graphs: Sequence[Data], cutoff: float, max_neighbours: int | None = None) -> list[Data]:
    """:func:`add_edges` of many single graphs with one neighbour search (:func:`search_many`).

    The graphs (each a ``Data`` with ``pos``, optional ``cell`` ``[1, 3, 3]`` / ``[3, 3]`` and
    ``pbc``) are searched as one batch, periodic and non-periodic mixed, and the edges split back:
    each result equals ``add_edges(graph, cutoff, max_neighbours)`` (same edges, same order),
    while the per-call overhead of the search (the kernel launches: most of the time for small
    structures) is paid once. Graphs whose positions differ in dtype or device are searched
    one by one.

    Returns:
        New ``Data`` objects (shallow copies), in the order given.

    Raises:
        NeighborListError, StructureError: as :func:`add_edges`, for the first graph at fault
            (the batch is searched again graph by graph to find it).
    """
    positions = [_checked_pos(g, "add_edges_many") for g in graphs]
    if len(graphs) < 2 or len({(p.dtype, p.device) for p in positions}) > 1:
        return [add_edges(g, cutoff, max_neighbours) for g in graphs]
    try:
        return search_many(graphs, cutoff, max_neighbours).split()
    except ValueError:  # NeighborListError, StructureError
        return [add_edges(g, cutoff, max_neighbours) for g in graphs]  # raises for the graph at fault


def _pbc_of(graph: Data, periodic: bool, device: torch.device) -> torch.Tensor:
    """``[3]`` bool flags of one graph: its ``pbc`` (all True when absent) if it has a cell, else False."""
    if not periodic:
        return torch.zeros(3, dtype=torch.bool, device=device)
    flags = getattr(graph, "pbc", None)
    if flags is None:
        return torch.ones(3, dtype=torch.bool, device=device)
    return torch.as_tensor(flags, device=device).reshape(3).to(torch.bool)
