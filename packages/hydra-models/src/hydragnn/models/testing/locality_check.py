"""The rank-decomposition contract checked without an MD engine: a cut-out cluster gives the
periodic structure's atomic energies, forces and virial (see :mod:`hydragnn.models.locality`).

A rank of a domain-decomposed engine holds its atoms and a shell of ghost atoms, evaluates the
model on them without periodicity, sums the energies of its own atoms and returns the ghost
forces to their owners. :func:`cut_out` builds what a single rank owning a whole periodic cell
would see (the cell's atoms first, then every periodic image within the shell), and
:func:`check_locality` compares that evaluation with the periodic one.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from ..locality import atomic_energies, receptive_field
from .graphs import brute_force_edges, voigt_to_matrix

__all__ = ["check_locality", "cut_out", "decomposed_evaluation"]


def cut_out(pos: torch.Tensor, cell: torch.Tensor, shell: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions [M, 3], owner [M])``: the ``N`` atoms of the cell first (``owner = arange(N)``),
    then every periodic image closer than ``shell`` to one of them, with the atom it copies."""
    cell = cell.reshape(3, 3)
    volume = torch.linalg.det(cell).abs()
    heights = [float(volume / torch.linalg.cross(cell[(a + 1) % 3], cell[(a + 2) % 3]).norm()) for a in range(3)]
    reach = [math.ceil(shell / h) + 1 for h in heights]
    shifts = [s for s in itertools.product(*(range(-r, r + 1) for r in reach)) if any(s)]
    shift = torch.tensor(shifts, dtype=pos.dtype) @ cell
    images = (pos.unsqueeze(0) + shift.unsqueeze(1)).reshape(-1, 3)
    owners = torch.arange(pos.shape[0]).repeat(len(shifts))
    near = torch.cdist(images, pos).min(dim=1).values < shell
    return torch.cat([pos, images[near]]), torch.cat([torch.arange(pos.shape[0]), owners[near]])


def decomposed_evaluation(model: Any, sample: Data, shell: float) -> dict[str, torch.Tensor]:
    """What one rank owning all of ``sample``'s cell computes with a ghost shell of ``shell`` Å:
    ``atomic [N]`` energies of the cell's atoms, ``forces [N, 3]`` (ghost forces added to their
    owners) and ``virial [3, 3]`` (``sum_a x_a f_a`` over local and ghost atoms, LAMMPS's sign)."""
    pos0 = cast(torch.Tensor, sample.pos)
    n = pos0.shape[0]
    positions, owner = cut_out(pos0.detach(), cast(torch.Tensor, sample.cell), shell)
    positions = positions.requires_grad_(True)
    edge_index, _ = brute_force_edges(positions.detach(), float(model_radius(model)))
    cluster = Data(x=cast(torch.Tensor, sample.x)[owner], pos=positions, edge_index=edge_index)
    atomic = atomic_energies(model, cluster)[:n]
    (grad,) = torch.autograd.grad(atomic.sum(), positions)
    forces = torch.zeros_like(pos0).index_add_(0, owner, -grad)
    virial = positions.detach().T @ -grad
    return {"atomic": atomic.detach(), "forces": forces, "virial": virial}


def model_radius(model: Any) -> float:
    members = getattr(model, "members", None)
    return float((members[0] if members is not None else model).config.radius)


def check_locality(model: Any, sample: Data, *, atol: float = 1e-12) -> None:
    """A rank's evaluation with the shell of :func:`~hydragnn.models.locality.receptive_field`
    equals the periodic one (atomic energies, folded forces, virial) within ``atol`` (use a
    float64 model and sample: they agree to 1e-16 for the built-in encoders); with a
    shell one radius short the atomic energies differ by more than 100 ``atol`` (the receptive
    field is not overstated by a whole shell)."""
    reach = receptive_field(model)
    pos = cast(torch.Tensor, sample.pos).detach().requires_grad_(True)
    periodic = sample.clone()  # edges again, in the sample's dtype (as the images' shifts are)
    periodic.pos = pos
    periodic.edge_index, periodic.edge_shift = brute_force_edges(pos.detach(), model_radius(model), sample.cell)
    sample = periodic
    energies = atomic_energies(model, periodic)
    (grad,) = torch.autograd.grad(energies.sum(), pos)
    out = model(sample, compute_forces=True, compute_stress=True)
    stress_name = next(k for k in out if k.startswith("stress"))
    volume = torch.linalg.det(cast(torch.Tensor, sample.cell).reshape(3, 3)).abs()
    full = voigt_to_matrix(out[stress_name].detach().reshape(1, -1))[0]
    rank = decomposed_evaluation(model, sample, reach)
    torch.testing.assert_close(rank["atomic"], energies.detach(), atol=atol, rtol=0, msg="atomic energies")
    torch.testing.assert_close(rank["forces"], -grad, atol=atol, rtol=0, msg="forces")
    torch.testing.assert_close(rank["virial"], -volume * full, atol=100 * atol, rtol=0, msg="virial")
    short = decomposed_evaluation(model, sample, reach - model_radius(model))
    gap = float((short["atomic"] - energies.detach()).abs().max())
    assert gap > 100 * atol, f"a shell one radius short changed the atomic energies by only {gap:.2e}"
