"""``HydraASECalculator``: a :class:`HydraCalculator` as an ASE calculator.

Properties: ``energy`` and ``free_energy`` (eV; the model predicts no electronic entropy, so
both are equal), ``forces [N, 3]`` (eV/Å), ``stress`` (Voigt ``xx, yy, zz, yz, xz, xy``, eV/Å³,
ASE's sign convention ``(1/V) dE/d(strain)``; 3-D periodic cells only), ``energies [N]`` (the
per-atom energy head, when the model has one) and every other head under its own name
(per-atom heads ``[N]`` or ``[N, dim]``, per-structure heads as a float or ``[dim]`` array).
Energy and forces are computed together on every calculation; stress only when asked.
The total charge is read from ``atoms.info["charge"]`` for models with a charge input, the spin
from ``atoms.info["spin"]`` for models with a spin input (0 when absent).
Neighbour lists are kept with a Verlet skin (default 0.5 Å, see :mod:`.neighbors`): MD steps
reuse them, with unchanged results, until an atom has moved more than half the skin.
A committee served with ``uncertainty=True`` adds ``energy_uncertainty`` (eV),
``forces_uncertainty [N]`` (eV/Å) and, with per-atom energies, ``energies_uncertainty [N]`` (eV);
``uncertainty_limit`` stops or flags a calculation whose largest force uncertainty passes a
threshold (:mod:`.uncertainty`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from .calculator import md_calculator
from .finite import require_finite
from .uncertainty import UncertaintyLimit, md_uncertainty


class HydraASECalculator(Calculator):
    """ASE calculator around a :class:`HydraCalculator`.

    Args:
        calc_or_path: a :class:`HydraCalculator`, a ``HydraModel`` or an artifact path.
        skin: Verlet skin (Å) of the neighbour list. ``None``: a calculator passed in keeps its
            own; one built here gets :data:`~.neighbors.MD_SKIN` (0.5 Å) when reuse applies to
            the model (:func:`~.neighbors.md_skin`), since this adapter mostly serves MD and
            optimisers. A value sets the calculator's skin (0: a fresh list on every call).
        uncertainty_limit: a :class:`~.uncertainty.UncertaintyLimit` (or a threshold in eV/Å:
            stop) applied to every calculation; needs a committee (a calculator passed in must
            have been built with ``uncertainty=True``; one built here is).
        **calculator_kwargs: passed to :class:`HydraCalculator` when it is built here.
    """

    default_parameters: dict[str, Any] = {}

    def __init__(
        self,
        calc_or_path: Any,
        *,
        skin: float | None = None,
        uncertainty_limit: UncertaintyLimit | float | None = None,
        **calculator_kwargs: Any,
    ) -> None:
        self.uncertainty_limit = md_uncertainty(calc_or_path, uncertainty_limit, calculator_kwargs)
        self.hydra = md_calculator(calc_or_path, skin, **calculator_kwargs)
        info = self.hydra.info
        self._head_names: dict[str, str] = {}  # model output name -> ASE property name
        if info.atomic_energy is not None:
            self._head_names[info.atomic_energy] = "energies"
        for name in (*info.node_outputs, *info.graph_outputs):
            self._head_names[name] = name
        props = ["energy", "free_energy"]
        if self.hydra.uncertainty:
            props.append("energy_uncertainty")
            if info.atomic_energy is not None:
                props.append("energies_uncertainty")
        if info.forces is not None:
            props.append("forces")
            if self.hydra.uncertainty:
                props.append("forces_uncertainty")
        if info.stress is not None:
            props.append("stress")
        self.implemented_properties = props + list(self._head_names.values())
        self.calculations = 0  # calculate() calls so far (named when an output is not finite)
        super().__init__()

    def calculate(
        self,
        atoms: Any = None,
        properties: Any = ("energy",),
        system_changes: Any = all_changes,
    ) -> None:
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        pbc = np.asarray(atoms.pbc, dtype=bool)
        want_stress = "stress" in properties
        if want_stress and not pbc.all():
            raise PropertyNotImplementedError("stress needs a 3-D periodic cell (atoms.pbc all True)")
        cell = atoms.cell.array if pbc.any() else None
        out = self.hydra(
            atoms.positions,
            atoms.numbers,
            charge=atoms.info.get("charge") if self.hydra.info.charge_input else None,
            spin=atoms.info.get("spin") if self.hydra.info.spin_input else None,
            cell=cell,
            pbc=pbc if cell is not None else None,
            forces=self.hydra.info.forces is not None,
            stress=want_stress,
        )
        self.calculations += 1
        require_finite(
            f"HydraASECalculator, calculation {self.calculations}",
            {"forces": out.get("forces"), "forces uncertainty": out.get("forces_uncertainty")},
            {"energy": out["energy"], "stress": out.get("stress")},
            symbols=atoms.get_chemical_symbols(),
        )
        where = f"HydraASECalculator, calculation {self.calculations}"
        if self.uncertainty_limit is not None and "forces_uncertainty" in out:
            self.uncertainty_limit.check(where, out["forces_uncertainty"], symbols=atoms.get_chemical_symbols())
        energy = float(out["energy"][0])
        self.results["energy"] = energy
        self.results["free_energy"] = energy
        if "forces" in out:
            self.results["forces"] = out["forces"].detach().cpu().numpy().astype(np.float64)
        if "energy_uncertainty" in out:
            self.results["energy_uncertainty"] = float(out["energy_uncertainty"][0])
        if "forces_uncertainty" in out:
            self.results["forces_uncertainty"] = out["forces_uncertainty"].detach().cpu().numpy().astype(np.float64)
        if "atomic_energy_uncertainty" in out:
            self.results["energies_uncertainty"] = (
                out["atomic_energy_uncertainty"].detach().cpu().numpy().astype(np.float64)
            )
        if "stress" in out:
            self.results["stress"] = full_3x3_to_voigt_6_stress(
                out["stress"][0].detach().cpu().numpy().astype(np.float64)
            )
        for name, prop in self._head_names.items():
            if name not in out:
                continue
            value = out[name].detach().cpu().numpy().astype(np.float64)
            if name in self.hydra.info.graph_outputs:
                value = value[0]
                value = float(value) if np.ndim(value) == 0 else value
            self.results[prop] = value


__all__ = ["HydraASECalculator"]
