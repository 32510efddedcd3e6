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

A committee with an uncertainty limit reduces each member's forces the same way and decides on
the largest spread over all ranks, so every rank stops at the same step (:meth:`DecomposedPotential._check`).

``fix external`` expects the all-rank totals of energy and virial on every rank. The cost: the
shell multiplies the atoms per rank by about ``(1 + 2 S / L)^3`` (``S`` the shell, ``L`` the
sub-domain side), so more ranks pay only for large systems.

:func:`decomposed_potential` is what ``attach_potential`` calls on several ranks: it refuses what
cannot be split, sets LAMMPS's ghost shell and skin, and :func:`check_ghost_shell` then refuses a
narrower ``comm_modify cutoff`` in the instance's later input.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InferenceError
from .lammps_potentials import INSTALL_HINT, CalculatorPotential, is_model

__all__ = ["DecomposedPotential", "check_ghost_shell", "decomposed_potential", "local_potential"]


def local_potential(potential: Any, needs: str) -> tuple[Any, float]:
    """``(HydraCalculator, receptive field)`` of an artifact path, model or calculator whose energy
    splits into atomic terms, for a route that evaluates part of a structure (several ranks,
    ML-IAP); ``needs`` starts each refusal (e.g. ``"HydraMLIAP: ML-IAP needs"``).

    Raises:
        InferenceError: no energy and forces, an energy normalised by data statistics, or a
            model that is not local (each reason named).
    """
    from hydragnn.models import ModelError, receptive_field

    from .calculator import HydraCalculator

    calc = potential if isinstance(potential, HydraCalculator) else HydraCalculator(potential)
    info = calc.info
    if info.energy is None or info.forces is None:
        raise InferenceError(f"{needs} an interatomic potential: the model predicts no energy and forces")
    if info.normalizer is not None and info.energy in info.normalizer:
        raise InferenceError(
            f"{needs} atomic energies: the model's energy is normalised by data statistics, which cannot be split "
            "into atomic terms; run it on one rank"
        )
    try:
        return calc, receptive_field(calc.model)
    except ModelError as exc:
        raise InferenceError(f"{needs} a local model; {exc}") from None


class DecomposedPotential:
    """A local HydraGNN potential evaluated on one rank's atoms and ghosts (module docstring).

    Args:
        calc_or_model: a ``HydraCalculator``, a ``HydraModel`` or a model artifact path.
        comm: the mpi4py communicator of the LAMMPS instance's ranks.
        uncertainty_limit: a :class:`~.uncertainty.UncertaintyLimit` (or a threshold, eV/Å) on the
            committee's per-atom force uncertainty (module docstring).

    Attributes:
        reach: the model's receptive field (Å); the ghost shell must be at least this plus the skin.
        calls: evaluations so far (named by an uncertainty error).

    Raises:
        InferenceError: the model is not a local potential (each reason named), its energy is
            normalised per structure, or a limit is given for a model without a committee.
    """

    def __init__(self, calc_or_model: Any, comm: Any, uncertainty_limit: Any = None) -> None:
        from hydragnn.models import Committee

        from .uncertainty import as_limit

        calc, self.reach = local_potential(calc_or_model, "potential: several MPI ranks need")
        self.model, self.info, self.comm = calc.model, calc.info, comm
        self.cutoff = float(self.info.cutoff)
        self.uncertainty_limit = as_limit(uncertainty_limit, "forces", "DecomposedPotential")
        if self.uncertainty_limit is not None and not isinstance(self.model, Committee):
            raise InferenceError(
                "uncertainty_limit: the model is not a committee (Architecture.committee >= 2): it has no spread"
            )
        self.calls = 0

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
        members = list(model.members) if self.uncertainty_limit is not None else [model]
        device = next(model.parameters()).device
        pos = torch.as_tensor(positions, dtype=model.geometry_dtype, device=device).requires_grad_(True)
        local_energies = [0.0] * len(members)
        member_forces = np.zeros((len(members), *positions.shape))
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
            for k, member in enumerate(members):
                local = atomic_energies(member, batch)[:nlocal].sum()
                (grad,) = torch.autograd.grad(local, pos)
                local_energies[k] = float(local)
                member_forces[k] = -grad.detach().cpu().double().numpy()
        top = self.comm.allreduce(int(ids.max()) if ids.size else 0, op=MPI.MAX)
        by_id = np.zeros((len(members), top + 1, 3))
        for k in range(len(members)):
            np.add.at(by_id[k], ids, member_forces[k])
        self.comm.Allreduce(MPI.IN_PLACE, by_id, op=MPI.SUM)
        forces = member_forces.mean(0)
        virial = np.ascontiguousarray(positions.T @ forces)
        self.comm.Allreduce(MPI.IN_PLACE, virial, op=MPI.SUM)
        energy = self.comm.allreduce(float(np.mean(local_energies)), op=MPI.SUM)
        self.calls += 1
        local_forces = by_id[:, ids[:nlocal]]  # [K, nlocal, 3]
        if self.uncertainty_limit is not None:
            self._check(local_forces, ids[:nlocal])
        return energy, local_forces.mean(0), virial

    def _check(self, local_forces: np.ndarray, local_ids: np.ndarray) -> None:
        """Apply the limit to the local atoms' force spread ``[nlocal]`` (from the members' forces
        ``[K, nlocal, 3]``, reduced by atom ID in one ``Allreduce``) with the largest value of all
        ranks (:func:`~.uncertainty.check_across_ranks`); the error names the rank's own atoms
        above the threshold by LAMMPS atom ID."""
        from .uncertainty import check_across_ranks

        assert self.uncertainty_limit is not None
        spread = np.sqrt(((local_forces - local_forces.mean(0)) ** 2).sum(-1).mean(0))
        where = f"DecomposedPotential, call {self.calls}, rank {self.comm.Get_rank()}"
        check_across_ranks(self.uncertainty_limit, where, spread, self.comm, atom_ids=local_ids)


def decomposed_potential(lmp: Any, potential: Any, nprocs: int, skin: float) -> DecomposedPotential:
    """The potential of a LAMMPS instance on ``nprocs`` ranks, with LAMMPS's ghost shell set for it."""
    if isinstance(potential, (str, os.PathLike)):
        import zipfile

        if zipfile.is_zipfile(potential):
            raise InferenceError(
                f"attach_potential: {potential} is an exported file, which runs on one rank; on {nprocs} ranks "
                "give the model artifact (model.hydra) or a HydraCalculator"
            )
    limit = None
    if isinstance(potential, CalculatorPotential):  # its calculator, and its limit on every rank
        potential, limit = potential.calc, potential.uncertainty_limit
    elif callable(potential) and not is_model(potential):
        raise InferenceError(
            f"attach_potential: a callable potential sees one rank's atoms only; on {nprocs} ranks give the "
            "model artifact (model.hydra), a HydraModel or a HydraCalculator"
        )
    if not (isinstance(skin, (int, float)) and not isinstance(skin, bool) and 0.0 <= skin < float("inf")):
        raise InferenceError(f"skin: expected a distance >= 0 in Å, found {skin!r}")
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise InferenceError(f"attach_potential: {nprocs} MPI ranks need mpi4py: {INSTALL_HINT}") from exc
    decomposed = DecomposedPotential(potential, MPI.COMM_WORLD, limit)
    shell = decomposed.reach + float(skin)
    lmp._hydragnn_shell = None  # this call's own settings pass
    lmp.command(f"neighbor {float(skin)} bin")
    lmp.command("neigh_modify every 1 delay 0 check yes")
    lmp.command(f"comm_modify cutoff {shell}")
    lmp._hydragnn_shell = shell
    return decomposed


_COMM_CUTOFF = re.compile(r"^\s*comm_modify\b[^#\n]*?\bcutoff\s+(\S+)", re.MULTILINE)


def check_ghost_shell(lmp: Any, name: str, args: tuple[Any, ...]) -> None:
    """Refuse a ``comm_modify cutoff`` below the ghost shell a potential on several ranks needs
    (``lmp._hydragnn_shell``, set by :func:`attach_potential`), before LAMMPS runs it: a narrower
    shell gives wrong forces without any error."""
    shell = getattr(lmp, "_hydragnn_shell", None)
    if shell is None or not args:
        return
    if name == "file":
        try:
            text = Path(args[0]).read_text(errors="replace")
        except OSError:
            return  # LAMMPS reports the unreadable file itself
    else:
        text = "\n".join(map(str, args[0])) if name == "commands_list" else str(args[0])
    for match in _COMM_CUTOFF.finditer(text):
        try:
            value = float(match.group(1))
        except ValueError:
            continue
        if value < shell:
            raise InferenceError(
                f"comm_modify cutoff {value:g}: the HydraGNN potential on several ranks needs a ghost shell of at "
                f"least {shell:g} Å (its receptive field plus the skin, which attach_potential set); a narrower "
                "one gives wrong forces"
            )
