"""One validation of structures for every entry point: ``prepare``, the neighbour list, the trainer's
loading of stored containers (:func:`check_sample`) and the calculator.

Rules (each violation is a :class:`StructureError` naming where and what):

* species: integer-valued atomic numbers in ``1..118`` (``0`` only where a layout uses it for
  padding), and below a model's embedding size when one is given;
* positions and cells: finite;
* a periodic cell must not be too small for the cutoff: along each periodic direction ``k`` the
  perpendicular width ``h_k = V / |a_i x a_j|`` must satisfy ``h_k * max_cell_images >= cutoff``.
  A smaller cell almost always comes from a unit mistake (a cell in nm, fractional coordinates
  passed as the cell); searching its images would produce millions of edges, gigabytes and
  nonsense energies.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import DataError
from .neighbors.inputs import complete_cells

MAX_ATOMIC_NUMBER = 118
"""The heaviest element (oganesson)."""
DEFAULT_MAX_CELL_IMAGES = 8
"""Periodic images searched per direction before a cell counts as too small for the cutoff."""
SPECIES_INPUT_NAMES: frozenset[str] = frozenset({"atomic_number", "atomic_numbers", "numbers", "z", "Z"})
"""Node inputs holding atomic numbers (their values are checked as species)."""


class StructureError(DataError, ValueError):
    """A structure no model should see: unknown species, non-finite coordinates, a cell too small
    for the cutoff. The message names where (file, sample, argument) and what was found."""


def check_species(numbers: torch.Tensor, where: str, *, padding: bool = False, limit: int | None = None) -> None:
    """Atomic numbers: integer-valued, ``1..118`` (``0`` allowed with ``padding``), ``< limit`` if given.

    Args:
        numbers: any shape, integer or floating dtype.
        where: prefix of the error message.
        padding: ``0`` marks padding (dense layouts).
        limit: exclusive upper bound from a model's species embedding.
    """
    if not numbers.numel():
        return
    values = numbers.detach()
    if values.is_floating_point():
        if not bool(torch.isfinite(values).all()) or bool((values != values.round()).any()):
            bad = values[~torch.isfinite(values) | (values != values.round())].flatten()[:3].tolist()
            raise StructureError(f"{where}: expected integer atomic numbers, found {bad}")
        values = values.round().long()
    low = 0 if padding else 1
    high = MAX_ATOMIC_NUMBER if limit is None else min(MAX_ATOMIC_NUMBER, limit - 1)
    wrong = (values < low) | (values > high)
    if bool(wrong.any()):
        bad = sorted(set(values[wrong].flatten().tolist()))[:5]
        which = "elements" if limit is None or limit - 1 >= MAX_ATOMIC_NUMBER else "the model's species embedding"
        raise StructureError(f"{where}: atomic numbers {bad} are outside {which} (expected {low}..{high})")


def check_finite(values: torch.Tensor, where: str, what: str = "values") -> None:
    if values.is_floating_point() and not bool(torch.isfinite(values.detach()).all()):
        rows = (~torch.isfinite(values.detach())).reshape(values.shape[0], -1).any(dim=1).nonzero().flatten()[:5]
        raise StructureError(f"{where}: expected finite {what}, found NaN or inf (rows {rows.tolist()})")


def perpendicular_widths(cell: torch.Tensor) -> torch.Tensor:
    """``[B, 3]`` distance between opposite faces of each full-rank cell ``[B, 3, 3]`` (``V / |a_i x a_j|``)."""
    a, b, c = cell[:, 0], cell[:, 1], cell[:, 2]
    volume = torch.linalg.cross(a, b).mul(c).sum(-1).abs()
    faces = torch.stack(
        [
            torch.linalg.cross(b, c).norm(dim=-1),
            torch.linalg.cross(c, a).norm(dim=-1),
            torch.linalg.cross(a, b).norm(dim=-1),
        ],
        dim=-1,
    )
    return volume.unsqueeze(-1) / faces.clamp_min(1e-300)


def check_cell_size(
    cell: torch.Tensor,
    pbc: torch.Tensor,
    cutoff: float,
    max_cell_images: int = DEFAULT_MAX_CELL_IMAGES,
    where: str = "cell",
) -> None:
    """Refuse periodic cells too small for ``cutoff`` (see the module docstring).

    Args:
        cell: ``[B, 3, 3]`` cells with linearly independent periodic rows (non-periodic rows are
            ignored: they are completed by :func:`~hydragnn.data.neighbors.inputs.complete_cells`).
        pbc: ``[B, 3]`` bool.
        cutoff: the neighbour cutoff (Å).
        max_cell_images: images allowed per direction.
    """
    if not bool(pbc.any()):
        return
    widths = perpendicular_widths(complete_cells(cell, pbc))
    needed = cutoff / max_cell_images
    small = pbc & (widths < needed)
    if bool(small.any()):
        b, k = (int(i) for i in small.nonzero()[0])
        raise StructureError(
            f"{where}: too small for the cutoff {cutoff:g} Å: structure {b} has a perpendicular width of "
            f"{float(widths[b, k]):.4g} Å along periodic lattice vector {k}; expected >= cutoff / max_cell_images = "
            f"{needed:.4g} Å (more than max_cell_images={max_cell_images} periodic images per direction would be searched); "
            "check the units (Å), "
            "build a supercell, or raise max_cell_images"
        )


def species_input(schema: Any) -> str | None:
    """The name of the schema's atomic-number node input, if it has one."""
    for var in getattr(schema, "inputs", ()):
        if var.level == "node" and var.name in SPECIES_INPUT_NAMES:
            return var.name
    return None


def check_sample(sample: Any, schema: Any, where: str) -> None:
    """The structure-level checks of one sample (a PyG ``Data``): species of the schema's
    atomic-number input, finite positions and cell. Cheap (no neighbour search)."""
    name = species_input(schema)
    if name is not None and isinstance(getattr(sample, name, None), torch.Tensor):
        check_species(sample[name], f"{where}: '{name}'")
    pos = getattr(sample, "pos", None)
    if isinstance(pos, torch.Tensor):
        check_finite(pos, f"{where}: 'pos'", "positions")
    cell = getattr(sample, "cell", None)
    if isinstance(cell, torch.Tensor) and cell.numel():
        check_finite(cell.reshape(-1, 3), f"{where}: 'cell'", "lattice vectors")
