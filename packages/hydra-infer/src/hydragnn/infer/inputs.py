"""Validation of calculator inputs and their normalisation to one flat layout.

Three layouts are accepted (N atoms, B structures):

* single: ``coord [N, 3]``, ``numbers [N]``;
* dense: ``coord [B, N, 3]``, ``numbers [B, N]``, padded with ``numbers == 0`` (the padded
  coordinates are ignored, even NaN);
* flat: ``coord [N, 3]``, ``numbers [N]``, ``mol_idx [N]`` (sorted, ``>= 0``; B is
  ``mol_idx.max() + 1 <= N``, so skipped indices are empty structures with energy 0; indices far
  apart, which would size every per-structure tensor by the largest, are refused).

``cell`` is ``[3, 3]`` (shared) or ``[B, 3, 3]``, rows are lattice vectors (ASE's convention);
``pbc`` is ``[3]`` or ``[B, 3]`` bool, ``None`` with a cell meaning periodic everywhere.

Cell rule ("too small for the cutoff"): for each periodic direction k the perpendicular width
``h_k = V / |a_i x a_j|`` must satisfy ``h_k * max_cell_images >= cutoff``; the neighbour search
then looks at most ``max_cell_images`` images away along k (``(2 m + 1)^3`` image cells per
atom). A smaller cell is refused with an :class:`InferenceError`: such cells almost always come
from a unit mistake (a cell in nm, or fractional coordinates passed as the cell) and would make
the image search explode. A singular or non-finite periodic cell is refused as well. These value
rules are hydra-data's (:mod:`hydragnn.data.validation`, ``check_periodic_cells``), the ones its
neighbour list applies; their errors are raised as :class:`InferenceError` with the same message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hydragnn.data import NeighborListError
from hydragnn.data.neighbors.inputs import check_periodic_cells
from hydragnn.data.validation import (
    DEFAULT_MAX_CELL_IMAGES,
    MAX_ATOMIC_NUMBER,
    StructureError,
    check_cell_size,
    check_finite,
)

from .errors import InferenceError

__all__ = ["DEFAULT_MAX_CELL_IMAGES", "CallInputs", "check_call"]


@dataclass
class CallInputs:
    """One validated call, flattened to the real atoms.

    Attributes:
        pos: ``[N, 3]`` positions of the real atoms (model geometry dtype, calculator device).
        numbers: ``[N]`` int64 atomic numbers.
        batch: ``[N]`` int64 structure of each atom (sorted).
        num_graphs: B.
        cell: ``[B, 3, 3]`` or ``None``.
        pbc: ``[B, 3]`` bool or ``None``.
        charge: ``[B]`` total charges or ``None``.
        spin: ``[B]`` spins or ``None``.
        layout: ``"single"``, ``"dense"`` or ``"flat"``.
        mask: ``[B, Nmax]`` bool real-atom mask for the dense layout, else ``None``.
        requires_grad: the caller's coordinates, cell, charge or spin required grad.
    """

    pos: torch.Tensor
    numbers: torch.Tensor
    batch: torch.Tensor
    num_graphs: int
    cell: torch.Tensor | None
    pbc: torch.Tensor | None
    charge: torch.Tensor | None
    layout: str
    mask: torch.Tensor | None
    requires_grad: bool
    spin: torch.Tensor | None = None

    def graph_attr(self, roles: tuple[str, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """``[B, len(roles)]`` graph inputs in the model's order (0 where the call gave none)."""
        if not roles:
            return None
        columns = []
        for role in roles:
            value = {"charge": self.charge, "spin": self.spin}[role]
            if value is None:
                value = torch.zeros(self.num_graphs, dtype=dtype, device=self.pos.device)
            columns.append(value.to(dtype))
        return torch.stack(columns, dim=-1)

    @property
    def counts(self) -> torch.Tensor:
        """``[B]`` atoms per structure."""
        return torch.bincount(self.batch, minlength=self.num_graphs)


def _tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise InferenceError(f"{name}: expected an array or tensor, found {type(value).__name__} ({exc})") from exc


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _integers(value: Any, name: str) -> torch.Tensor:
    t = _tensor(value, name)
    if t.is_floating_point():
        if not bool(torch.isfinite(t).all()) or not bool((t == t.round()).all()):
            raise InferenceError(f"{name}: expected integers, found non-integer values")
    elif t.dtype == torch.bool or t.is_complex():
        raise InferenceError(f"{name}: expected integers, found dtype {t.dtype}")
    return t.long()


def _flatten(
    coord_t: torch.Tensor, numbers_t: torch.Tensor, mol_idx: Any
) -> tuple[str, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(layout, num_graphs, pos [M, 3], numbers [M], batch [M], mask [B, N] or None)`` of the
    call's real atoms: ``"dense"`` for ``coord [B, N, 3]`` (number 0 pads), ``"flat"`` for
    ``coord [N, 3]`` with ``mol_idx``, ``"single"`` without. Raises InferenceError on shapes."""
    mask = None
    if coord_t.dim() == 3:
        if coord_t.shape[-1] != 3:
            raise InferenceError(f"coord: expected [N, 3] or [B, N, 3], found {_shape(coord_t)}")
        if mol_idx is not None:
            raise InferenceError("mol_idx: only with coord [N, 3]; found a dense coord [B, N, 3] together with mol_idx")
        if numbers_t.shape != coord_t.shape[:2]:
            raise InferenceError(
                f"numbers: expected {tuple(coord_t.shape[:2])} to match coord {_shape(coord_t)}, found {_shape(numbers_t)}"
            )
        layout = "dense"
        num_graphs = int(coord_t.shape[0])
        mask = numbers_t != 0
        pos = coord_t.detach()[mask]
        z = numbers_t[mask]
        rows = torch.arange(num_graphs, device=mask.device).unsqueeze(1).expand_as(mask)
        batch = rows[mask]
    elif coord_t.dim() == 2:
        if coord_t.shape[-1] != 3:
            raise InferenceError(f"coord: expected [N, 3] or [B, N, 3], found {_shape(coord_t)}")
        if numbers_t.shape != coord_t.shape[:1]:
            raise InferenceError(
                f"numbers: expected ({coord_t.shape[0]},) to match coord {_shape(coord_t)}, found {_shape(numbers_t)}"
            )
        pos, z = coord_t.detach(), numbers_t
        if mol_idx is None:
            layout, num_graphs = "single", 1
            batch = torch.zeros(pos.shape[0], dtype=torch.long)
        else:
            layout = "flat"
            batch = _integers(mol_idx, "mol_idx").to("cpu")
            if batch.shape != coord_t.shape[:1]:
                raise InferenceError(
                    f"mol_idx: expected one entry per atom ({coord_t.shape[0]},), found {_shape(batch)}"
                )
            if batch.numel() and (int(batch.min()) < 0 or bool((batch[1:] < batch[:-1]).any())):
                raise InferenceError(
                    "mol_idx: expected sorted (non-decreasing) indices >= 0, found an unsorted or negative vector"
                )
            num_graphs = int(batch.max()) + 1 if batch.numel() else 0
            if num_graphs > batch.numel():  # every per-structure tensor is sized by the largest index
                raise InferenceError(
                    f"mol_idx: indices up to {num_graphs - 1} for {batch.numel()} atoms would make {num_graphs} "
                    "structures; expected at most one structure per atom (consecutive indices from 0)"
                )
    else:
        raise InferenceError(f"coord: expected [N, 3] or [B, N, 3], found {_shape(coord_t)}")
    return layout, num_graphs, pos, z, batch, mask


def check_call(
    coord: Any,
    numbers: Any,
    *,
    charge: Any,
    spin: Any = None,
    cell: Any,
    pbc: Any,
    mol_idx: Any,
    cutoff: float,
    max_cell_images: int,
    species: frozenset[int] | None,
    max_species: int | None,
    dtype: torch.dtype,
    device: torch.device,
) -> CallInputs:
    """Validate one call and flatten it.

    Args:
        coord, numbers, charge, spin, cell, pbc, mol_idx: the call's arguments (arrays or tensors).
        cutoff: the model's cutoff (Å).
        max_cell_images: periodic images allowed per direction (see the module docstring).
        species: atomic numbers the model was trained on, or ``None``.
        max_species: exclusive upper bound of the atomic numbers the model can embed, or ``None``.
        dtype: floating dtype of the positions handed to the model.
        device: calculator device.

    Returns:
        The :class:`CallInputs`.

    Raises:
        InferenceError: naming the argument, the expected and the found shape or value.
    """
    coord_t = _tensor(coord, "coord")
    requires_grad = bool(coord_t.requires_grad)
    if not (coord_t.is_floating_point() or coord_t.dtype in (torch.int32, torch.int64)):
        raise InferenceError(f"coord: expected a floating array, found dtype {coord_t.dtype}")
    numbers_t = _integers(numbers, "numbers")
    layout, num_graphs, pos, z, batch, mask = _flatten(coord_t, numbers_t, mol_idx)

    if layout != "dense" and z.numel() and bool((z == 0).any()):
        raise InferenceError(
            "numbers: atomic number 0 marks padding, which only the dense layout coord [B, N, 3] allows"
        )
    if z.numel() and bool((z < 0).any()):
        raise InferenceError(f"numbers: expected atomic numbers >= 1, found {int(z.min())}")
    pos = pos.to(device=device, dtype=dtype)
    with _as_inference_error():
        check_finite(pos, "coord", "coordinates of the real atoms")
    _check_species(z, species, max_species)

    cell_t, pbc_t, cell_grad = _check_cell(cell, pbc, num_graphs, dtype, device)
    requires_grad = (
        requires_grad or cell_grad or any(isinstance(v, torch.Tensor) and v.requires_grad for v in (charge, spin))
    )
    if cell_t is not None and pbc_t is not None:  # _check_cell gives both or neither
        with _as_inference_error():  # hydra-data's rules, as its neighbour list applies them
            check_finite(cell_t, "cell", "lattice vectors")
            check_periodic_cells(cell_t, pbc_t)
            check_cell_size(cell_t, pbc_t, cutoff, max_cell_images, where="cell")
    charge_t = _per_structure(charge, "charge", num_graphs, dtype, device)
    spin_t = _per_structure(spin, "spin", num_graphs, dtype, device)
    return CallInputs(
        pos=pos.contiguous(),
        numbers=z.to(device),
        batch=batch.to(device),
        num_graphs=num_graphs,
        cell=cell_t,
        pbc=pbc_t,
        charge=charge_t,
        spin=spin_t,
        layout=layout,
        mask=mask.to(device) if mask is not None else None,
        requires_grad=requires_grad,
    )


def _per_structure(
    value: Any, name: str, num_graphs: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """A scalar or ``[B]`` per-structure input (total charge, spin) as a ``[B]`` tensor."""
    if value is None:
        return None
    t = _tensor(value, name).to(device=device, dtype=dtype).reshape(-1)
    if t.numel() == 1 and num_graphs != 1:
        t = t.expand(num_graphs)
    if t.shape != (num_graphs,):
        raise InferenceError(f"{name}: expected a scalar or [B] = ({num_graphs},), found {_shape(t)}")
    if not bool(torch.isfinite(t).all()):
        raise InferenceError(f"{name}: expected finite values, found NaN or inf")
    return t


def _check_species(z: torch.Tensor, species: frozenset[int] | None, max_species: int | None) -> None:
    if not z.numel():
        return
    present = set(torch.unique(z).tolist())
    if species is not None:
        unknown = sorted(present - species)
        if unknown:
            raise InferenceError(
                f"numbers: species {unknown} were not in the model's training species {sorted(species)}"
            )
    elif max_species is not None:
        unknown = sorted(s for s in present if s >= max_species)
        if unknown:
            raise InferenceError(
                f"numbers: atomic numbers {unknown} are outside the model's species embedding (expected 1..{max_species - 1})"
            )
    heavy = sorted(s for s in present if s > MAX_ATOMIC_NUMBER)
    if heavy:
        raise InferenceError(f"numbers: atomic numbers {heavy} are not elements (expected 1..{MAX_ATOMIC_NUMBER})")


@contextmanager
def _as_inference_error() -> Iterator[None]:
    """Run hydra-data checks: their errors (which name the argument) become :class:`InferenceError`."""
    try:
        yield
    except (StructureError, NeighborListError) as exc:
        raise InferenceError(str(exc)) from None


def _check_cell(
    cell: Any, pbc: Any, num_graphs: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """The calculator's cell layouts -> ``cell [B, 3, 3]``, ``pbc [B, 3]`` (or ``None, None``) and
    whether the cell required grad. Only shapes are parsed here (the layouts are stricter than
    the neighbour list's, which also takes PyG-collated ones); values are hydra-data's checks."""
    pbc_t = None
    if pbc is not None:
        pbc_t = _tensor(pbc, "pbc")
        if pbc_t.dtype != torch.bool:
            if pbc_t.is_floating_point() or not bool(((pbc_t == 0) | (pbc_t == 1)).all()):
                raise InferenceError(f"pbc: expected booleans, found dtype {pbc_t.dtype}")
            pbc_t = pbc_t.bool()
        if pbc_t.dim() == 0:
            pbc_t = pbc_t.expand(3)
        if pbc_t.shape == (3,):
            pbc_t = pbc_t.unsqueeze(0).expand(num_graphs, 3)
        if pbc_t.shape != (num_graphs, 3):
            raise InferenceError(f"pbc: expected [3] or [B, 3] = ({num_graphs}, 3), found {_shape(pbc_t)}")
    if cell is None:
        if pbc_t is not None and bool(pbc_t.any()):
            raise InferenceError("cell: periodic boundary conditions (pbc) need a cell [3, 3] or [B, 3, 3]; found none")
        return None, None, False
    cell_t = _tensor(cell, "cell")
    grad = bool(cell_t.requires_grad)
    cell_t = cell_t.detach().to(device=device, dtype=dtype)
    if cell_t.shape == (3, 3):
        cell_t = cell_t.unsqueeze(0).expand(num_graphs, 3, 3)
    if cell_t.shape != (num_graphs, 3, 3):
        raise InferenceError(f"cell: expected [3, 3] or [B, 3, 3] = ({num_graphs}, 3, 3), found {_shape(cell_t)}")
    if pbc_t is None:
        pbc_t = torch.ones(num_graphs, 3, dtype=torch.bool)
    return cell_t.contiguous(), pbc_t.to(device).contiguous(), grad
