"""Validation and normalisation of neighbor-list inputs (shared by every backend).

:func:`check_inputs` turns the loosely typed public arguments of
:func:`hydragnn.data.neighbors.radius_graph` into a :class:`GraphInputs` with one cell and one
``pbc`` row per graph, or raises :class:`~hydragnn.data.errors.NeighborListError` saying what
was expected, what was found, and where.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

from ..errors import NeighborListError

#: A periodic cell whose normalised volume ``|det(cell)| / prod(|row|)`` is below this is singular.
SINGULAR_TOLERANCE = 1e-8


@dataclass(frozen=True)
class GraphInputs:
    """Checked inputs of a radius-graph construction.

    Attributes:
        pos: ``[N, 3]`` positions, detached, float32 or float64.
        cutoff: Cutoff radius, finite and positive.
        batch: ``[N]`` int64 graph index, sorted.
        num_graphs: Number of graphs ``B`` (graphs without atoms included).
        cell: ``[B, 3, 3]`` cells in the dtype of ``pos`` (rows are lattice vectors), as given,
            so it may require grad; ``None`` when no cell was given.
        pbc: ``[B, 3]`` bool periodic flags; all False when no cell was given.
    """

    pos: torch.Tensor
    cutoff: float
    batch: torch.Tensor
    num_graphs: int
    cell: torch.Tensor | None
    pbc: torch.Tensor

    @property
    def periodic(self) -> bool:
        """Whether any graph is periodic along any direction."""
        return self.cell is not None and bool(self.pbc.any())


def _shape(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def check_max_neighbours(max_neighbours: int | None) -> int | None:
    """Return ``max_neighbours`` as an int, or raise for anything but ``None`` or an int >= 1."""
    if max_neighbours is None:
        return None
    if isinstance(max_neighbours, bool) or not isinstance(max_neighbours, int) or max_neighbours < 1:
        raise NeighborListError(f"max_neighbours: expected None or an int >= 1, found {max_neighbours!r}")
    return int(max_neighbours)


MAX_COORDINATE = 1.0e6
"""Largest |coordinate| and |cell entry| accepted, Å: beyond it float32 positions resolve no bond
(ulp 0.06 Å) and the search's cell arithmetic overflows; such inputs are errors, not structures."""


def _check_pos(pos: object) -> torch.Tensor:
    if not isinstance(pos, torch.Tensor):
        raise NeighborListError(f"pos: expected a tensor of shape [N, 3], found a {type(pos).__name__}")
    if pos.dim() != 2 or pos.shape[1] != 3:
        raise NeighborListError(f"pos: expected shape [N, 3], found {_shape(pos)}")
    if pos.dtype not in (torch.float32, torch.float64):
        raise NeighborListError(f"pos: expected float32 or float64, found {_shape(pos)}")
    pos = pos.detach()
    bad = ~torch.isfinite(pos).all(dim=1)
    if bool(bad.any()):
        rows = bad.nonzero().flatten()[:5].tolist()
        raise NeighborListError(f"pos: expected finite coordinates, found NaN or inf in atom rows {rows}")
    far = (pos.abs() > MAX_COORDINATE).any(dim=1)
    if bool(far.any()):
        rows = far.nonzero().flatten()[:5].tolist()
        raise NeighborListError(
            f"pos: coordinates beyond {MAX_COORDINATE:g} Å in atom rows {rows} (a unit error or a damaged file: "
            "no neighbour search is meaningful there)"
        )
    return pos


def _check_cutoff(cutoff: object) -> float:
    if isinstance(cutoff, torch.Tensor) and cutoff.numel() == 1:
        cutoff = cutoff.item()
    if isinstance(cutoff, bool) or not isinstance(cutoff, Real):
        raise NeighborListError(f"cutoff: expected a positive float, found {cutoff!r}")
    value = float(cutoff)
    if not math.isfinite(value) or value <= 0.0:
        raise NeighborListError(f"cutoff: expected a finite float > 0, found {value!r}")
    return value


def _check_batch(batch: object, n: int, device: torch.device) -> tuple[torch.Tensor, int]:
    if batch is None:
        return torch.zeros(n, dtype=torch.long, device=device), 1
    if not isinstance(batch, torch.Tensor):
        raise NeighborListError(f"batch: expected an int64 tensor of shape [{n}], found a {type(batch).__name__}")
    if batch.dim() != 1 or batch.shape[0] != n:
        raise NeighborListError(f"batch: expected shape [{n}] (one graph index per atom), found {_shape(batch)}")
    if batch.dtype.is_floating_point or batch.dtype.is_complex or batch.dtype == torch.bool:
        raise NeighborListError(f"batch: expected an integer tensor, found {_shape(batch)}")
    batch = batch.to(device=device, dtype=torch.long)
    if n == 0:
        return batch, 0
    if bool((batch < 0).any()):
        raise NeighborListError(f"batch: expected graph indices >= 0, found minimum {int(batch.min())}")
    drops = (batch[1:] < batch[:-1]).nonzero().flatten()
    if drops.numel():
        k = int(drops[0])
        raise NeighborListError(
            f"batch: expected sorted graph indices (PyG convention), found batch[{k}] = {int(batch[k])} "
            f"> batch[{k + 1}] = {int(batch[k + 1])}"
        )
    return batch, int(batch[-1]) + 1


def _check_cell(cell: object, num_graphs: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not isinstance(cell, torch.Tensor):
        raise NeighborListError(f"cell: expected a tensor of shape [3, 3] or [B, 3, 3], found a {type(cell).__name__}")
    if cell.dim() == 2 and cell.shape == (3, 3):
        cell = cell.unsqueeze(0).expand(max(num_graphs, 1), 3, 3)
    elif cell.dim() == 2 and cell.shape[1] == 3 and cell.shape[0] % 3 == 0:
        cell = cell.reshape(-1, 3, 3)  # PyG collates per-graph [3, 3] cells into [3B, 3]
    if cell.dim() != 3 or cell.shape[1:] != (3, 3):
        raise NeighborListError(
            f"cell: expected shape [3, 3] or [B, 3, 3] (rows are lattice vectors), found {_shape(cell)}"
        )
    if cell.shape[0] < num_graphs:
        raise NeighborListError(
            f"cell: given for some graphs only: expected one cell per graph ({num_graphs} graphs in batch), "
            f"found {cell.shape[0]}; give every graph a cell and mark non-periodic ones with pbc False"
        )
    if not cell.dtype.is_floating_point:
        raise NeighborListError(f"cell: expected a floating-point tensor, found {_shape(cell)}")
    if not bool(torch.isfinite(cell.detach()).all()):
        raise NeighborListError("cell: expected finite entries, found NaN or inf")
    if bool((cell.detach().abs() > MAX_COORDINATE).any()):
        raise NeighborListError(f"cell: entries beyond {MAX_COORDINATE:g} Å (a unit error or a damaged file)")
    return cell.to(device=device, dtype=dtype)


def _check_pbc(pbc: object, num_graphs: int, device: torch.device) -> torch.Tensor:
    if not isinstance(pbc, torch.Tensor):
        try:
            pbc = torch.as_tensor(pbc)
        except (TypeError, ValueError, RuntimeError) as err:
            raise NeighborListError(f"pbc: expected [3] or [B, 3] booleans, found {pbc!r}") from err
    if pbc.dtype.is_floating_point or pbc.dtype.is_complex:
        raise NeighborListError(f"pbc: expected booleans, found {_shape(pbc)}")
    if pbc.shape in ((3,), (1, 3)):
        pbc = pbc.reshape(1, 3).expand(num_graphs, 3)
    elif pbc.dim() == 1 and pbc.shape[0] == 3 * num_graphs:
        pbc = pbc.reshape(num_graphs, 3)  # PyG collates per-graph [3] flags into [3B]
    if pbc.dim() != 2 or pbc.shape != (num_graphs, 3):
        raise NeighborListError(f"pbc: expected shape [3] or [{num_graphs}, 3], found {_shape(pbc)}")
    return pbc.to(device=device, dtype=torch.bool)


def check_periodic_cells(cell: torch.Tensor, pbc: torch.Tensor) -> None:
    """Raise if the periodic lattice vectors of some graph are (nearly) linearly dependent.

    Args:
        cell: ``[B, 3, 3]`` cells.
        pbc: ``[B, 3]`` bool flags; only the rows of periodic directions are checked.
    """
    c = cell.detach().to(torch.float64)
    norms = c.norm(dim=-1)
    scale = torch.where(pbc, norms, torch.ones_like(norms)).clamp_min(1e-300)
    unit = torch.where(pbc.unsqueeze(-1), c / scale.unsqueeze(-1), torch.zeros_like(c))
    # Gram determinant of the unit periodic rows: the squared normalised volume they span, in [0, 1].
    gram = unit @ unit.transpose(1, 2) + torch.diag_embed((~pbc).to(torch.float64))
    volume = torch.linalg.det(gram).clamp_min(0.0).sqrt()
    zero = (pbc & (norms <= 0.0)).any(dim=1)
    bad = (zero | (volume < SINGULAR_TOLERANCE)) & pbc.any(dim=1)
    if bool(bad.any()):
        g = int(bad.nonzero()[0])
        raise NeighborListError(
            f"cell: graph {g} has a singular cell along its periodic directions (pbc {pbc[g].tolist()}): "
            f"expected linearly independent lattice vectors, found rows {c[g].tolist()}"
        )


def check_inputs(
    pos: object,
    cutoff: object,
    batch: object = None,
    cell: object = None,
    pbc: object = None,
) -> GraphInputs:
    """Validate the arguments of a radius-graph call.

    Args:
        pos: ``[N, 3]`` float32 or float64 positions.
        cutoff: Cutoff radius, > 0.
        batch: ``[N]`` sorted integer graph index, or ``None`` for a single graph.
        cell: ``[3, 3]`` (shared by all graphs), ``[B, 3, 3]``, ``[3B, 3]`` (PyG-collated) or ``None``.
        pbc: ``[3]``, ``[B, 3]``, ``[3B]`` booleans, or ``None`` (all True with a cell).

    Returns:
        The checked :class:`GraphInputs`.

    Raises:
        NeighborListError: On any malformed input, with what was expected and what was found.
    """
    pos = _check_pos(pos)
    value = _check_cutoff(cutoff)
    batch, num_graphs = _check_batch(batch, pos.shape[0], pos.device)
    if cell is None:
        if pbc is not None and bool(torch.as_tensor(pbc).any()):
            raise NeighborListError("pbc: periodic directions requested but no cell was given")
        flags = torch.zeros(num_graphs, 3, dtype=torch.bool, device=pos.device)
        return GraphInputs(pos, value, batch, num_graphs, None, flags)
    cell = _check_cell(cell, num_graphs, pos.dtype, pos.device)
    num_graphs = cell.shape[0]
    if pbc is None:
        flags = torch.ones(num_graphs, 3, dtype=torch.bool, device=pos.device)
    else:
        flags = _check_pbc(pbc, num_graphs, pos.device)
    check_periodic_cells(cell, flags)
    return GraphInputs(pos, value, batch, num_graphs, cell, flags)


def complete_cell(inputs: GraphInputs) -> torch.Tensor:
    """:func:`complete_cells` of checked inputs (identity cells without a cell)."""
    if inputs.cell is None:
        return torch.eye(3, dtype=torch.float64, device=inputs.pos.device).expand(inputs.num_graphs, 3, 3).clone()
    return complete_cells(inputs.cell, inputs.pbc)


def complete_cells(cell: torch.Tensor, pbc: torch.Tensor) -> torch.Tensor:
    """Full-rank float64 cells whose non-periodic rows are an orthonormal complement.

    The periodic rows of each cell are kept; the rows of non-periodic directions (which may be
    zero or arbitrary in the input) are replaced by unit vectors orthogonal to the periodic rows
    and to each other. Pairs and integer image offsets along periodic directions do not depend on
    the non-periodic rows, so this changes no result while making every cell invertible.

    Args:
        cell: ``[B, 3, 3]`` cells (rows are lattice vectors).
        pbc: ``[B, 3]`` bool flags.

    Returns:
        ``[B, 3, 3]`` float64 cells.
    """
    b = cell.shape[0]
    eye = torch.eye(3, dtype=torch.float64, device=cell.device).expand(b, 3, 3)
    periodic = torch.where(pbc.unsqueeze(-1), cell.detach().to(torch.float64), torch.zeros_like(eye))
    # Right singular vectors of zero singular value span the complement of the periodic rows.
    _, _, vh = torch.linalg.svd(periodic)
    m = pbc.sum(dim=1, keepdim=True)  # [B, 1] number of periodic directions
    slot = m + torch.cumsum((~pbc).long(), dim=1) - 1  # [B, 3] complement index for non-periodic rows
    slot = slot.clamp(max=2)
    complement = torch.gather(vh, 1, slot.unsqueeze(-1).expand(b, 3, 3))
    return torch.where(pbc.unsqueeze(-1), periodic, complement)
