"""Capture-safe cell lists: the in-graph neighbour search of the sparse and periodic engines.

Linear in the atom count: each structure of the batch gets a grid of bins at least the search
radius wide (planned eagerly at build, :func:`plan_grid`); in the graph, every atom is binned, the
bins are filled into a table of ``capacity`` atoms each, and every atom meets the atoms of its 27
neighbouring bins (``[N, 27, capacity]`` candidates) instead of all ``N - 1`` others. Candidates
within the search radius are compacted by a prefix sum into an edge buffer of fixed size.
Everything has static shapes and no host synchronisation; overflows are reported as outputs that
the engine checks after a replay (:class:`Search`).

Periodic cells are binned in fractional coordinates (a bin's perpendicular width is at least the
radius, so a pair within it sits in neighbouring bins, across the cell's faces through an integer
image); this needs at least 3 bins along every direction (a cell 3 radii wide), else a naive
search serves (:func:`plan_grid` returns ``None``). Open structures are binned over their bounding
box with one spare bin on each side; an atom that leaves the grid is reported.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from hydragnn.data.validation import perpendicular_widths

STENCIL = torch.tensor(list(itertools.product((-1, 0, 1), repeat=3)), dtype=torch.long)
"""``[27, 3]`` bin offsets searched around an atom's bin."""
BIN_SPARE = 1.25
"""Atoms per bin = ``BIN_SPARE`` x the fullest bin at build (at least :data:`MIN_BIN_CAPACITY`)."""
MIN_BIN_CAPACITY = 4
MAX_BINS_PER_ATOM = 4
"""An open structure gets at most this many bins per atom (+ 27): sparse ones get wider bins."""
GRID_MARGIN = 0.05
"""A periodic grid is planned for bins ``(1 + GRID_MARGIN)`` x the radius wide, so the cell may shrink that much."""
CANDIDATE_BYTES = 64
"""Rough bytes per candidate pair in the graph (index, vector, distance, mask, prefix sum), for budgets."""


def search_radius(cutoff: float, dtype: torch.dtype) -> float:
    """The candidate radius: a little beyond the cutoff, so rounding in the search loses no pair
    (the regular path's rule, ``|r_ij| < cutoff``, then decides: :meth:`Search.edges`)."""
    return cutoff * (1 + 1e-5) + 1e3 * torch.finfo(dtype).eps


@dataclass(frozen=True)
class Grid:
    """The bins of a batch: per structure ``dims [B, 3]``, the first global bin ``offsets [B]`` and,
    for open structures, ``origin [B, 3]`` and bin edge ``width [B]``; ``total`` bins in all,
    ``capacity`` atoms per bin; ``radius``: the search radius the bins were planned for."""

    periodic: bool
    dims: torch.Tensor
    offsets: torch.Tensor
    origin: torch.Tensor
    width: torch.Tensor
    total: int
    capacity: int
    radius: float

    KEYS = ("grid_stencil", "grid_dims", "grid_offsets", "grid_origin", "grid_width")
    """The names :meth:`buffers` gives (read inside a capture without touching a tensor)."""

    def buffers(self) -> dict[str, torch.Tensor]:
        """The grid's tensors, for an engine's static buffers."""
        return {
            "grid_stencil": STENCIL.to(self.dims.device),  # on the device: no host copy inside a capture
            "grid_dims": self.dims,
            "grid_offsets": self.offsets,
            "grid_origin": self.origin,
            "grid_width": self.width,
        }

    def candidate_bytes(self, num_atoms: int) -> int:
        """Estimated memory of one search over ``num_atoms`` atoms (the in-graph temporaries)."""
        return num_atoms * 27 * self.capacity * CANDIDATE_BYTES


def _scatter_extreme(pos: torch.Tensor, batch: torch.Tensor, num_graphs: int, reduce: str) -> torch.Tensor:
    out = pos.new_zeros(num_graphs, 3)
    return out.scatter_reduce(0, batch.unsqueeze(1).expand(-1, 3), pos, reduce=reduce, include_self=False)


def plan_grid(
    pos: torch.Tensor, batch: torch.Tensor, num_graphs: int, cell: torch.Tensor | None, radius: float
) -> Grid | None:
    """The grid for a call (eager, at build), or ``None`` for a periodic cell under 3 bins wide.

    ``pos [N, 3]``, ``batch [N]`` (sorted), ``cell [B, 3, 3]`` (rows are lattice vectors) or
    ``None`` for open structures; ``radius``: the search radius.
    """
    dev, dtype = pos.device, pos.dtype
    if cell is not None:
        dims = torch.floor(perpendicular_widths(cell) / (radius * (1 + GRID_MARGIN))).long()
        if bool((dims < 3).any()):
            return None
        origin = torch.zeros(num_graphs, 3, dtype=dtype, device=dev)
        width = torch.zeros(num_graphs, dtype=dtype, device=dev)
    else:
        lo = _scatter_extreme(pos, batch, num_graphs, "amin")
        hi = _scatter_extreme(pos, batch, num_graphs, "amax")
        counts = torch.bincount(batch, minlength=num_graphs)
        width = torch.full((num_graphs,), radius, dtype=dtype, device=dev)
        dims = torch.ceil((hi - lo) / width.unsqueeze(1)).long().clamp(min=1) + 2
        for _ in range(64):  # widen the bins of sparse structures until they have few per atom
            dims = torch.ceil((hi - lo) / width.unsqueeze(1)).long().clamp(min=1) + 2
            too_many = dims.prod(dim=1) > MAX_BINS_PER_ATOM * counts + 27
            if not bool(too_many.any()):
                break
            width = torch.where(too_many, width * 1.5, width)
        origin = lo - width.unsqueeze(1)
    sizes = dims.prod(dim=1)
    offsets = torch.cumsum(sizes, 0) - sizes
    grid = Grid(cell is not None, dims, offsets, origin, width, int(sizes.sum()), 1, float(radius))
    glob, _, _ = bin_atoms(pos, batch, grid.buffers(), cell)
    fullest = int(torch.bincount(glob, minlength=grid.total).max()) if glob.numel() else 0
    capacity = max(MIN_BIN_CAPACITY, math.ceil(fullest * BIN_SPARE) + 1)
    return Grid(grid.periodic, dims, offsets, origin, width, grid.total, capacity, grid.radius)


def bin_atoms(
    pos: torch.Tensor, batch: torch.Tensor, grid: dict[str, torch.Tensor], cell: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(global bin [N], bin coordinates [N, 3], cell offsets [N, 3] or empty)``, capture-safe.

    Periodic: fractional coordinates wrapped into the cell (``frac = pos @ cell^-1``; the integer
    offsets removed are returned), then binned. Open: binned from the grid's origin, coordinates
    clamped into the grid (:func:`outside` says whether any atom left it).
    """
    dims = grid["grid_dims"].index_select(0, batch)
    if cell is not None:
        inv = torch.linalg.inv_ex(cell)[0].index_select(0, batch)
        frac = torch.einsum("ni,nij->nj", pos, inv)
        off = torch.floor(frac)
        coords = torch.floor((frac - off) * dims.to(frac.dtype)).long()
    else:
        rel = (pos - grid["grid_origin"].index_select(0, batch)) / grid["grid_width"].index_select(0, batch).unsqueeze(
            1
        )
        off = pos.new_zeros(0, 3)
        coords = torch.floor(rel).long()
    coords = torch.minimum(coords.clamp(min=0), dims - 1)
    return grid["grid_offsets"].index_select(0, batch) + _local(coords, dims), coords, off


def _local(coords: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """Row-major index of bin ``coords [N, 3]`` in grids of ``dims [N, 3]``."""
    return (coords[:, 0] * dims[:, 1] + coords[:, 1]) * dims[:, 2] + coords[:, 2]


def outside(pos: torch.Tensor, batch: torch.Tensor, grid: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[]`` bool: an atom of an open structure lies outside its grid (capture-safe)."""
    rel = (pos - grid["grid_origin"].index_select(0, batch)) / grid["grid_width"].index_select(0, batch).unsqueeze(1)
    dims = grid["grid_dims"].index_select(0, batch)
    return ((rel < 0) | (rel >= dims.to(rel.dtype))).any()


@dataclass
class Search:
    """One in-graph search: ``src``, ``dst`` ``[C]`` (sink-padded), integer ``image [C, 3]`` (periodic:
    ``r_src - r_dst + image @ cell`` is the pair vector of the unwrapped positions; zeros when open),
    and the overflow outputs ``count`` (pairs within the radius), ``fullest`` (the fullest bin) and
    ``lost`` (open: an atom left the grid; periodic: the cell got too narrow for its bins)."""

    src: torch.Tensor
    dst: torch.Tensor
    image: torch.Tensor
    count: torch.Tensor
    fullest: torch.Tensor
    lost: torch.Tensor

    def edges(
        self, pos: torch.Tensor, cutoff: float, offset: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edge_index [2, C], kept [C])``: the pairs within ``cutoff`` by the regular path's rule
        (``|r_src - r_dst + offset| < cutoff``), the others sink -> sink; ``pos [N + 1, 3]``
        includes the sink node, ``offset [C, 3]`` the periodic image vectors (None: open)."""
        sink = pos.shape[0] - 1
        vec = pos.index_select(0, self.src) - pos.index_select(0, self.dst)
        if offset is not None:
            vec = vec + offset
        kept = (self.src < sink) & ((vec * vec).sum(-1) < cutoff * cutoff)
        return torch.stack([torch.where(kept, self.src, sink), torch.where(kept, self.dst, sink)]), kept

    def outputs(self) -> dict[str, torch.Tensor]:
        """The static outputs :func:`overflow` reads after a replay."""
        return {"_edge_count": self.count, "_fullest_bin": self.fullest, "_lost": self.lost}


def overflow(outputs: dict[str, torch.Tensor], capacity: int, bin_capacity: int) -> int | None:
    """After a replay: ``None`` when the search fitted its buffers, else its pair count (a rebuild):
    more pairs than ``capacity``, a bin fuller than ``bin_capacity``, or the grid lost an atom."""
    count = int(outputs["_edge_count"])
    if count > capacity or int(outputs["_fullest_bin"]) > bin_capacity or bool(outputs["_lost"]):
        return count
    return None


def search(
    pos: torch.Tensor,
    batch: torch.Tensor,
    cell: torch.Tensor | None,
    grid: dict[str, torch.Tensor],
    total: int,
    bin_capacity: int,
    radius: float,
    capacity: int,
) -> Search:
    """Pairs ``(src, dst)`` of one structure within ``radius`` (no self pair), compacted into
    ``capacity`` slots; capture-safe (see the module docstring). ``pos [N, 3]``, ``batch [N]``,
    ``cell [B, 3, 3]`` or ``None``, ``grid``: :meth:`Grid.buffers`."""
    n, dev = pos.shape[0], pos.device
    sink = n
    glob, coords, off = bin_atoms(pos, batch, grid, cell)
    # the bin table [total + 1, M]: atoms sorted by bin, ranked within it; row ``total`` stays empty
    order = torch.argsort(glob, stable=True)
    counts = torch.zeros(total, dtype=torch.long, device=dev).scatter_add(0, glob, torch.ones_like(glob))
    start = torch.cumsum(counts, 0) - counts
    sorted_bins = glob.index_select(0, order)
    rank = torch.arange(n, device=dev) - start.index_select(0, sorted_bins)
    slot = torch.where(rank < bin_capacity, sorted_bins * bin_capacity + rank, total * bin_capacity)
    table = torch.full(((total + 1) * bin_capacity + 1,), sink, dtype=torch.long, device=dev)
    table = table.scatter(0, slot, order)[:-1].view(total + 1, bin_capacity)
    # the candidates, one neighbouring bin at a time (27 passes over [N, M], not one [N, 27, M]): the
    # bin around each atom's, wrapped across the cell's faces or dropped at an open grid's edge;
    # pairs compacted into the edge buffer as they come, overflowing ones sent to a dump slot
    dims = grid["grid_dims"].index_select(0, batch)  # [N, 3]
    first = grid["grid_offsets"].index_select(0, batch)
    cells = cell.index_select(0, batch) if cell is not None else None
    wrapped = pos - torch.einsum("nk,nkj->nj", off, cells) if cells is not None else pos
    padded = torch.cat([wrapped, wrapped.new_zeros(1, 3)])
    me = torch.arange(n, device=dev).unsqueeze(1)
    fill = torch.full((capacity + 1,), sink, dtype=torch.long, device=dev)
    src, dst, stencil = fill, fill, torch.full_like(fill, 13)
    count = torch.zeros((), dtype=torch.long, device=dev)
    wraps = []
    for k in range(STENCIL.shape[0]):
        around = coords + grid["grid_stencil"][k]
        wrap = torch.div(around, dims, rounding_mode="floor")
        wraps.append(wrap)
        if cell is not None:
            bins = first + _local(around - wrap * dims, dims)
        else:
            exists = ((around >= 0) & (around < dims)).all(-1)
            bins = torch.where(exists, first + _local(torch.minimum(around.clamp(min=0), dims - 1), dims), total)
        cand = table.index_select(0, bins)  # [N, M]
        vec = padded.index_select(0, cand.reshape(-1)).view(n, bin_capacity, 3) - wrapped.unsqueeze(1)
        if cells is not None:
            vec = vec + torch.einsum("nk,nkj->nj", wrap.to(pos.dtype), cells).unsqueeze(1)
        valid = ((cand < sink) & (cand != me) & ((vec * vec).sum(-1) < radius * radius)).reshape(-1)
        at = count + torch.cumsum(valid, 0) - 1
        count = count + valid.sum()
        slot = torch.where(valid & (at < capacity), at, capacity)
        src = src.scatter(0, slot, cand.reshape(-1))
        dst = dst.scatter(0, slot, me.expand(n, bin_capacity).reshape(-1))
        stencil = stencil.scatter(0, slot, torch.full_like(slot, k))
    src, dst, stencil = src[:capacity], dst[:capacity], stencil[:capacity]
    if cell is not None:
        real = dst < sink
        at = torch.where(real, dst, 0)
        wrap = torch.stack(wraps, dim=1)  # [N, 27, 3]
        image = (
            wrap[at, stencil] - off.long().index_select(0, torch.where(real, src, 0)) + off.long().index_select(0, at)
        )
        image = torch.where(real.unsqueeze(1), image, 0)
        narrow = (perpendicular_widths(cell) / grid["grid_dims"].to(cell.dtype) < radius).any()
    else:
        image = torch.zeros(capacity, 3, dtype=torch.long, device=dev)
        narrow = outside(pos, batch, grid)
    return Search(src, dst, image, count, counts.max(), narrow)
