"""A HydraGNN potential on several LAMMPS MPI ranks: each rank evaluates its atoms and a ghost shell.

LAMMPS splits the box into one sub-domain per rank; ``comm_modify cutoff`` gives each rank copies
of the atoms within that distance of its sub-domain (ghosts: other ranks' atoms and periodic
images). With a shell of the model's receptive field (:func:`hydragnn.models.receptive_field`)
plus the neighbour skin, every local atom's energy is exact when the model runs on local + ghost
atoms without periodicity (:mod:`hydragnn.models.locality`; ``check_locality`` proves it per
encoder). :class:`DecomposedPotential` then returns, on every rank:

* the energy: the sum of the local atoms' energies, summed over ranks;
* the forces of the local atoms: minus the gradient of the rank's local energy with respect to
  every atom it holds, ghost forces added to the atom they copy (by atom ID, one ``Allreduce``
  over ``[max ID + 1, 3]``): LAMMPS's own reverse communication runs before ``fix external``'s
  callback, so the callback returns them itself;
* the virial ``sum_a x_a f_a`` over the rank's local and ghost atoms (translation invariant, as
  the gradients of a local energy sum to zero), summed over ranks.

``fix external`` expects the all-rank totals of energy and virial on every rank. The cost: the
shell multiplies the atoms per rank by about ``(1 + 2 S / L)^3`` (``S`` the shell, ``L`` the
sub-domain side), so more ranks pay only for large systems.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InferenceError

__all__ = ["DecomposedPotential"]


class DecomposedPotential:
    """A local HydraGNN potential evaluated on one rank's atoms and ghosts (module docstring).

    Args:
        calc_or_model: a ``HydraCalculator``, a ``HydraModel`` or a model artifact path.
        comm: the mpi4py communicator of the LAMMPS instance's ranks.

    Attributes:
        reach: the model's receptive field (Å); the ghost shell must be at least this plus the skin.

    Raises:
        InferenceError: the model is not a local potential (each reason named), or its energy is
            normalised per structure.
    """

    def __init__(self, calc_or_model: Any, comm: Any) -> None:
        from hydragnn.models import ModelError, receptive_field

        from .calculator import HydraCalculator

        calc = calc_or_model if isinstance(calc_or_model, HydraCalculator) else HydraCalculator(calc_or_model)
        self.model, self.info, self.comm = calc.model, calc.info, comm
        if self.info.energy is None or self.info.forces is None:
            raise InferenceError("potential: the model predicts no energy and forces (an interatomic potential)")
        norm = self.info.normalizer
        if norm is not None and self.info.energy in norm:
            raise InferenceError(
                "potential: the model's energy is normalised by data statistics, which several ranks cannot split "
                "into atomic terms; run it on one rank"
            )
        try:
            self.reach = receptive_field(self.model)
        except ModelError as exc:
            raise InferenceError(f"potential: several MPI ranks need a local model; {exc}") from None
        self.cutoff = float(self.info.cutoff)

    def __call__(
        self, positions: np.ndarray, numbers: np.ndarray, ids: np.ndarray, nlocal: int
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """``(energy, forces [nlocal, 3], virial [3, 3])``: energy and virial summed over ranks,
        forces of the local atoms with every rank's ghost contributions.

        Args:
            positions: ``[M, 3]`` float64, the rank's local atoms (first ``nlocal``) then its ghosts, Å.
            numbers: ``[M]`` int64 atomic numbers; ids: ``[M]`` LAMMPS atom IDs (a ghost has its
                original's).
        """
        import torch
        from mpi4py import MPI

        from hydragnn.data.neighbors import radius_graph
        from hydragnn.models import atomic_energies

        from .batching import model_batch

        model = self.model
        device = next(model.parameters()).device
        pos = torch.as_tensor(positions, dtype=model.geometry_dtype, device=device).requires_grad_(True)
        local_energy = 0.0
        forces = np.zeros_like(positions)
        if positions.shape[0]:
            edge_index, _ = radius_graph(pos.detach(), self.cutoff)
            batch = model_batch(
                model,
                pos=pos,
                numbers=torch.as_tensor(numbers, dtype=torch.long, device=device),
                batch=torch.zeros(pos.shape[0], dtype=torch.long, device=device),
                edge_index=edge_index,
                num_graphs=1,
            )
            local = atomic_energies(model, batch)[:nlocal].sum()
            (grad,) = torch.autograd.grad(local, pos)
            local_energy = float(local)
            forces = -grad.detach().cpu().double().numpy()
        top = self.comm.allreduce(int(ids.max()) if ids.size else 0, op=MPI.MAX)
        by_id = np.zeros((top + 1, 3))
        np.add.at(by_id, ids, forces)
        self.comm.Allreduce(MPI.IN_PLACE, by_id, op=MPI.SUM)
        virial = np.ascontiguousarray(positions.T @ forces)
        self.comm.Allreduce(MPI.IN_PLACE, virial, op=MPI.SUM)
        energy = self.comm.allreduce(local_energy, op=MPI.SUM)
        return energy, by_id[ids[:nlocal]], virial
