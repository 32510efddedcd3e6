"""The export check: a written file, loaded as its users load it, against the calculator.

:func:`check_references` computes :class:`~hydragnn.infer.HydraCalculator`'s outputs on
:func:`check_structures` (a molecule and a triclinic periodic cell of other sizes than the trace's,
every atom one of the model's species) before any file is written; :func:`check_file` runs the
written file on the same structures (``ExportedModel`` for AOTInductor / TorchScript,
``metatomic_ase`` for metatomic) and refuses any output that differs by more than the tolerance.
A committee exported with ``uncertainty`` is checked against the calculator's uncertainty too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hydragnn.models import HydraModel

from ..calculator import HydraCalculator
from ..errors import InferenceError
from ..model_info import ModelInfo
from .graph import ExportError, check_species, fcc_lattice


def check_structures(info: ModelInfo) -> list[Any]:
    """A 7-atom molecule and a 12-atom triclinic periodic cell (the trace used a 32-atom cubic one).

    Every atom is one of :func:`.graph.check_species` (the model's training species when it lists
    them), so a model trained on any chemistry can be checked.
    """
    from ase import Atoms
    from ase.build import bulk

    first, second = check_species(info)
    rng = np.random.default_rng(7)
    molecule = Atoms(
        numbers=[first, second, first, first, second, first, second],
        positions=rng.normal(scale=1.2, size=(7, 3)) + np.array([0.0, 0.0, 0.0]),
    )
    periodic = bulk("Cu", "fcc", a=fcc_lattice(info.cutoff)) * (2, 2, 3)  # the primitive fcc cell: triclinic
    periodic.numbers[:] = first
    periodic.numbers[::3] = second  # every atom one of the model's species, whatever they are
    periodic.rattle(0.08, seed=3)
    return [molecule, periodic]


def _reference(
    model: HydraModel, info: ModelInfo, atoms: Any, fixed: Mapping[str, float], uncertainty: bool
) -> dict[str, np.ndarray]:
    calc = HydraCalculator(model, skin=0.0, uncertainty=uncertainty)
    periodic = bool(atoms.pbc.any())
    out = calc(
        atoms.positions,
        atoms.numbers,
        cell=atoms.cell.array if periodic else None,
        pbc=atoms.pbc if periodic else None,
        forces=True,
        stress=periodic,
        charge=fixed.get("charge"),
        spin=fixed.get("spin"),
    )
    result = {k: v.detach().cpu().double().numpy() for k, v in out.items()}
    for name in ("energy", *info.graph_outputs, *(["stress"] if periodic else [])):
        result[name] = result[name][0]  # one structure: drop the batch dimension, as the file does
    if "energy_uncertainty" in result:
        result["energy_uncertainty"] = result["energy_uncertainty"][0]
    return result


def _exported(
    path: Path, fmt: str, atoms: Any, info: ModelInfo, device: str, uncertainty: bool = False
) -> dict[str, np.ndarray]:
    """The written file's outputs for ``atoms``, loaded as its users load it."""
    if fmt == "metatomic":
        from .pyg_patch import pyg_index_select_restored

        with pyg_index_select_restored():
            from metatomic_ase import MetatomicCalculator

            calc = MetatomicCalculator(str(path), device=device)  # the device the file was exported for
            atoms = atoms.copy()
            atoms.calc = calc
            out = {"energy": np.array(atoms.get_potential_energy()), "forces": atoms.get_forces()}
            if atoms.pbc.any():
                from ase.stress import voigt_6_to_full_3x3_stress

                out["stress"] = voigt_6_to_full_3x3_stress(atoms.get_stress())
            if uncertainty:
                out.update(_metatomic_uncertainty(calc, atoms, info.atomic_energy is not None))
            return out
    from .runtime import ExportedModel, structure_inputs

    exported = ExportedModel(path)
    raw = exported.run(*structure_inputs(atoms, info.cutoff, exported.dtype, exported.device))
    out = {k: v.detach().cpu().double().numpy() for k, v in raw.items()}
    if not atoms.pbc.any():
        out.pop("stress", None)
    out.pop("virial", None)
    return out


def _metatomic_uncertainty(calc: Any, atoms: Any, per_atom: bool) -> dict[str, np.ndarray]:
    """The file's ``energy_uncertainty`` under the calculator's name (``atomic_energy_uncertainty``
    per atom, ``energy_uncertainty`` per structure)."""
    from metatomic.torch import ModelOutput

    request = {"energy_uncertainty": ModelOutput(unit="eV", sample_kind="atom" if per_atom else "system")}
    values = calc.run_model(atoms, request)["energy_uncertainty"].block().values.detach().cpu().double().numpy()
    return {"atomic_energy_uncertainty": values.reshape(-1)} if per_atom else {"energy_uncertainty": values.reshape(())}


def check_references(
    model: HydraModel, info: ModelInfo, fixed: Mapping[str, float], *, uncertainty: bool = False
) -> list[tuple[Any, dict[str, np.ndarray]]]:
    """:func:`check_structures` with the calculator's outputs for each, computed before any file is written.

    Raises:
        ExportError: the calculator refuses a check structure (the message says why).
    """
    pairs = []
    for atoms in check_structures(info):
        try:
            pairs.append((atoms, _reference(model, info, atoms, fixed, uncertainty)))
        except InferenceError as exc:
            raise ExportError(f"export check: the calculator refuses the check structure ({exc})") from None
    return pairs


def check_file(
    path: Path,
    fmt: str,
    model: HydraModel,
    info: ModelInfo,
    *,
    references: list[tuple[Any, dict[str, np.ndarray]]],
    tolerance: float,
    uncertainty: bool = False,
) -> dict[str, float]:
    """Largest differences between the file and the calculator's ``references`` (:func:`check_references`).

    Raises:
        ExportError: an output missing from the file, or differing by more than ``tolerance``
            (relative to the output's largest magnitude, at least 1).
    """
    worst: dict[str, float] = {}
    for atoms, ref in references:
        kind = "periodic cell" if atoms.pbc.any() else "molecule"
        try:
            got = _exported(path, fmt, atoms, info, next(model.parameters()).device.type, uncertainty)
        except Exception as exc:  # the file's runtime raises its own types; the message says what
            first = " ".join(str(exc).split())[-400:]
            raise ExportError(
                f"export check ({kind}): the written file fails ({type(exc).__name__}: ...{first}); it was not kept"
            ) from exc
        for name, value in got.items():
            if name not in ref:
                continue
            expected = ref[name]
            if value.shape != expected.shape:
                raise ExportError(
                    f"export check ({kind}): {name} has shape {value.shape}, the calculator's {expected.shape}"
                )
            diff = float(np.abs(value - expected).max()) if value.size else 0.0
            scale = max(1.0, float(np.abs(expected).max()) if expected.size else 0.0)
            if not diff <= tolerance * scale:
                raise ExportError(
                    f"export check ({kind}): {name} differs from the calculator's by {diff:.3g} "
                    f"(tolerance {tolerance * scale:.3g}); the file was not written"
                )
            worst[name] = max(worst.get(name, 0.0), diff)
        required = ["energy", "forces"]
        if uncertainty:
            required.append("atomic_energy_uncertainty" if info.atomic_energy else "energy_uncertainty")
        for name in required:
            if name not in got:
                raise ExportError(f"export check ({kind}): the file gives no {name}")
    return worst
