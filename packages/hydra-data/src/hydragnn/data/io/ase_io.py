"""Conversion between ASE ``Atoms`` and raw HydraGNN samples (PyG ``Data``).

A sample built by :func:`atoms_to_sample` carries (N atoms):

==================  ==============  =====================================================
attribute           shape / dtype   meaning
==================  ==============  =====================================================
``atomic_number``   ``[N, 1]`` i64  atomic numbers
``pos``             ``[N, 3]``      Cartesian positions, Å
``cell``            ``[1, 3, 3]``   lattice vectors as rows, Å; only when the atoms have a
                                    cell (any periodic direction or a nonzero cell)
``pbc``             ``[1, 3]`` bool periodic directions (always present)
``natoms``          ``[1]`` i64     N
``energy``          ``[1, 1]``      total potential energy, eV
``energy_per_atom`` ``[1, 1]``      ``energy / N``, eV
``atomic_energy``   ``[N, 1]``      per-atom energies, eV (ASE ``energies``)
``forces``          ``[N, 3]``      forces, eV/Å
``stress``          ``[1, 6]``      stress in Voigt order (xx, yy, zz, yz, xz, xy), eV/Å³
==================  ==============  =====================================================

The labels (the last five) are present only when known. They are read from
``atoms.calc.results`` without triggering a calculation (results of a calculator whose
geometry no longer matches the atoms are ignored with a warning); when the calculator lacks one, the
common conventions ``atoms.info["energy"]``, ``atoms.info["stress"]``,
``atoms.arrays["forces"]`` and ``atoms.arrays["energies"]`` are used instead.
Floating tensors take the requested ``dtype``; in float64 a round trip through
:func:`sample_to_atoms` is exact.
"""

from __future__ import annotations

import warnings
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
import torch
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.stress import full_3x3_to_voigt_6_stress
from torch_geometric.data import Data

from ..errors import SchemaError
from ..pyg_data import new_data

__all__ = [
    "STRUCTURE_KEYS",
    "arrays_sample",
    "atoms_to_sample",
    "sample_to_atoms",
    "stress_voigt",
    "structure_arrays",
    "structure_sample",
]


def _labels(atoms: Atoms) -> dict[str, Any]:
    """Known results of ``atoms`` without calling the calculator (stale results are dropped)."""
    calc = atoms.calc
    results: dict[str, Any] = dict(getattr(calc, "results", None) or {}) if calc is not None else {}
    if results and calc is not None and getattr(calc, "atoms", None) is not None and hasattr(calc, "check_state"):
        changes = calc.check_state(atoms)
        if changes:
            warnings.warn(
                f"atoms_to_sample: the calculator's results belong to another geometry (changed: "
                f"{', '.join(changes)}); they are ignored",
                stacklevel=3,
            )
            results = {}
    for key in ("energy", "stress"):
        if key not in results and key in atoms.info:
            results[key] = atoms.info[key]
    for key in ("forces", "energies"):
        if key not in results and key in atoms.arrays:
            results[key] = atoms.arrays[key]
    return results


def stress_voigt(stress: Any) -> np.ndarray:
    """A stress as Voigt 6 ``(xx, yy, zz, yz, xz, xy)`` from Voigt 6 or a full ``(3, 3)`` (float64)."""
    arr = np.asarray(stress, dtype=np.float64)
    if arr.shape == (3, 3):
        return full_3x3_to_voigt_6_stress(arr)
    if arr.shape == (6,):
        return arr
    raise SchemaError(f"stress: expected shape (6,) Voigt or (3, 3), found {arr.shape}")


STRUCTURE_KEYS: tuple[str, ...] = ("atomic_number", "pos", "cell", "pbc", "natoms")
"""Attributes :func:`structure_sample` sets (never label names)."""


def structure_arrays(atoms: Atoms) -> dict[str, np.ndarray]:
    """The geometry of one ASE structure as numpy arrays, in the order and shapes of
    :func:`structure_sample`: ``atomic_number [N, 1]`` int64, ``pos [N, 3]`` float64, ``cell
    [1, 3, 3]`` float64 when the atoms have a cell (any periodic direction or a nonzero cell),
    ``pbc [1, 3]`` bool, ``natoms [1]`` int64."""
    n = len(atoms)
    out = {
        "atomic_number": atoms.numbers.astype(np.int64).reshape(n, 1),
        "pos": np.asarray(atoms.positions, dtype=np.float64).reshape(n, 3),
    }
    pbc = np.asarray(atoms.pbc, dtype=bool)
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    if pbc.any() or cell.any():
        out["cell"] = cell.reshape(1, 3, 3)
    out["pbc"] = pbc.reshape(1, 3)
    out["natoms"] = np.array([n], dtype=np.int64)
    return out


def arrays_sample(arrays: dict[str, np.ndarray], dtype: torch.dtype = torch.float64) -> Data:
    """A sample holding ``arrays`` as tensors, in their order: floating arrays in ``dtype`` (without a
    copy when it is float64), others as they are."""
    data = new_data()
    for key, value in arrays.items():
        t = torch.as_tensor(value)
        data[key] = t.to(dtype) if t.is_floating_point() else t
    return data


def structure_sample(atoms: Atoms, *, dtype: torch.dtype = torch.float64) -> Data:
    """The geometry of one ASE structure as a sample, without any label.

    Returns:
        A ``Data`` with ``atomic_number [N, 1]`` int64, ``pos [N, 3]``, ``pbc [1, 3]`` bool,
        ``natoms [1]`` int64 and ``cell [1, 3, 3]`` when the atoms have a cell (any periodic
        direction or a nonzero cell); floating tensors in ``dtype`` (:func:`structure_arrays`).

    Raises:
        SchemaError: when ``dtype`` is not floating point.
    """
    if not dtype.is_floating_point:
        raise SchemaError(f"atoms_to_sample: dtype must be floating point, found {dtype}")
    return arrays_sample(structure_arrays(atoms), dtype)


def atoms_to_sample(atoms: Atoms, *, dtype: torch.dtype = torch.float64) -> Data:
    """Convert one ASE structure to a raw sample.

    Args:
        atoms: the structure; its calculator (if any) is read, never run.
        dtype: floating dtype of ``pos``, ``cell`` and the labels.

    Returns:
        A ``Data`` with ``atomic_number [N, 1]`` int64, ``pos [N, 3]``, ``pbc [1, 3]`` bool,
        ``natoms [1]`` int64, ``cell [1, 3, 3]`` when the atoms have a cell, and, when known,
        ``energy [1, 1]``, ``energy_per_atom [1, 1]``, ``atomic_energy [N, 1]``,
        ``forces [N, 3]``, ``stress [1, 6]`` (Voigt xx, yy, zz, yz, xz, xy).

    Raises:
        SchemaError: when ``dtype`` is not floating point or a stored label has a wrong shape.
    """
    data = structure_sample(atoms, dtype=dtype)
    n = len(atoms)

    def f(value: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(value, dtype=np.float64)).to(dtype)

    results = _labels(atoms)
    if results.get("energy") is not None:
        energy = float(np.asarray(results["energy"], dtype=np.float64).reshape(()))
        data.energy = f(energy).reshape(1, 1)
        data.energy_per_atom = f(energy / n if n else 0.0).reshape(1, 1)
    for key, name, width in (("energies", "atomic_energy", 1), ("forces", "forces", 3)):
        if results.get(key) is None:
            continue
        arr = np.asarray(results[key], dtype=np.float64)
        if arr.size != n * width:
            raise SchemaError(f"{key}: expected {n * width} values for {n} atoms, found shape {arr.shape}")
        data[name] = f(arr).reshape(n, width)
    if results.get("stress") is not None:
        data.stress = f(stress_voigt(results["stress"])).reshape(1, 6)
    return data


def _single(sample: Data, name: str, numel: int) -> np.ndarray | None:
    t = getattr(sample, name, None)
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.numel() != numel:
        found = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise SchemaError(f"sample_to_atoms: {name!r}: expected {numel} values, found {found}")
    return t.detach().cpu().to(torch.float64).numpy().reshape(-1)


def sample_to_atoms(sample: Data) -> Atoms:
    """Convert a raw sample of one structure back to ASE.

    Args:
        sample: a ``Data`` with ``atomic_number [N, 1]`` (or ``[N]``) and ``pos [N, 3]``,
            optionally ``cell [1, 3, 3]``, ``pbc [1, 3]`` and the labels ``energy``,
            ``atomic_energy [N, 1]``, ``forces [N, 3]``, ``stress [1, 6]``. When
            ``energy`` is absent but ``energy_per_atom`` is present the energy is ``N`` times it.

    Returns:
        ``Atoms`` with a ``SinglePointCalculator`` holding the labels present (energy, forces,
        stress as Voigt 6, energies); no calculator when there are none.

    Raises:
        SchemaError: when a required attribute is missing or a shape is wrong (a batch of
            several structures is rejected).
    """
    numbers = getattr(sample, "atomic_number", None)
    pos = getattr(sample, "pos", None)
    if not isinstance(numbers, torch.Tensor) or not isinstance(pos, torch.Tensor):
        raise SchemaError("sample_to_atoms: the sample needs tensors 'atomic_number' [N, 1] and 'pos' [N, 3]")
    n = int(pos.shape[0]) if pos.dim() == 2 else -1
    if pos.dim() != 2 or pos.shape[1] != 3 or numbers.numel() != n:
        raise SchemaError(
            f"sample_to_atoms: expected 'pos' (N, 3) and 'atomic_number' with N values, "
            f"found {tuple(pos.shape)} and {tuple(numbers.shape)}"
        )
    cell = _single(sample, "cell", 9)
    pbc_t = getattr(sample, "pbc", None)
    if pbc_t is not None and (not isinstance(pbc_t, torch.Tensor) or pbc_t.numel() != 3):
        raise SchemaError(f"sample_to_atoms: 'pbc': expected 3 values, found {pbc_t!r}")
    pbc = pbc_t.detach().cpu().reshape(3).numpy().astype(bool) if pbc_t is not None else False
    atoms = Atoms(
        numbers=numbers.detach().cpu().reshape(-1).numpy().astype(int),
        positions=pos.detach().cpu().to(torch.float64).numpy(),
        cell=cell.reshape(3, 3) if cell is not None else None,
        pbc=pbc,
    )

    results: dict[str, Any] = {}
    energy = _single(sample, "energy", 1)
    if energy is None:
        per_atom = _single(sample, "energy_per_atom", 1)
        if per_atom is not None:
            energy = per_atom * n
    if energy is not None:
        results["energy"] = float(energy[0])
    forces = _single(sample, "forces", 3 * n)
    if forces is not None:
        results["forces"] = forces.reshape(n, 3)
    stress = _single(sample, "stress", 6)
    if stress is not None:
        results["stress"] = stress
    energies = _single(sample, "atomic_energy", n)
    if energies is not None:
        results["energies"] = energies
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms
