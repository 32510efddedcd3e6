"""Reference data from real physics: Cu–Au alloys labelled with ASE's EMT potential.

Everything is computed locally (no network) and is deterministic for a seed: the same call
returns the same numbers bit for bit.

* :func:`generate_cuau` — the ``CuAu_32atoms`` set, computed with EMT (a local stand-in with the
  cell size of upstream's LSMS set of that name, which ``Dataset.name`` alone selects:
  :mod:`hydragnn.data.named.datasets`): 2×2×2 conventional fcc supercells (32
  atoms) with Au fractions cycling through ``(0, 0.25, 0.5, 0.75, 1)`` on randomly chosen
  sites, the Vegard lattice constant between EMT's Cu and Au, a random symmetric strain of a
  few percent and a Gaussian rattle of the positions.
* :func:`generate_bulk` — the same recipe in cells of about 1,000 atoms, for scale tests.
* :func:`generate_alloy_atoms` — the same recipe for any two of EMT's fcc metals
  (:data:`EMT_METALS`), so tests and examples can use a chemistry other than Cu-Au.
* :func:`write_extxyz` — structures written as a user's extxyz file would be (labels under
  ``REF_energy`` / ``REF_forces`` / ``REF_stress``, a ``config_type``), with EMT's free-atom
  energies as ``IsolatedAtom`` frames from :func:`isolated_atom_frames`.

Labels come from :class:`ase.calculators.emt.EMT`: total energy, energy per atom, per-atom
energies (which sum to the total), forces and stress. Samples have the layout of
:func:`hydragnn.data.io.ase_io.atoms_to_sample`; :data:`CUAU_VARIABLES` is the matching JSON
``Variables`` section for an interatomic-potential task.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.data import atomic_numbers, reference_states
from torch_geometric.data import Data

from .errors import DataError
from .io.ase_io import atoms_to_sample

__all__ = [
    "A_AU",
    "A_CU",
    "COMPOSITIONS",
    "CUAU_VARIABLES",
    "EMT_METALS",
    "bulk_repeat",
    "generate_bulk",
    "generate_bulk_atoms",
    "generate_cuau",
    "generate_alloy_atoms",
    "generate_cuau_atoms",
    "isolated_atom_frames",
    "lattice_constant",
    "write_extxyz",
]

A_CU = 3.59
"""EMT equilibrium fcc lattice constant of Cu, Å."""
A_AU = 4.056
"""EMT equilibrium fcc lattice constant of Au, Å."""
COMPOSITIONS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Au fractions cycled through by the generators."""
EMT_METALS: tuple[str, ...] = ("Al", "Ni", "Cu", "Pd", "Ag", "Pt", "Au")
"""The fcc metals ASE's EMT has parameters for: what :func:`generate_alloy_atoms` mixes."""

CUAU_VARIABLES: dict[str, list[dict[str, Any]]] = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [
        {"name": "energy", "level": "graph", "dim": 1},
        {"name": "atomic_energy", "level": "node", "dim": 1},
        {"name": "forces", "level": "node", "dim": 3},
    ],
}
"""JSON ``Variables`` for the MLIP task on the reference sets (copy it before editing)."""


def lattice_constant(symbol: str) -> float:
    """The fcc lattice constant (Å) used for an element of :data:`EMT_METALS`: EMT's own for Cu and
    Au (:data:`A_CU`, :data:`A_AU`), ASE's reference state for the others.

    Raises:
        DataError: an element EMT has no fcc parameters for.
    """
    if symbol not in EMT_METALS:
        raise DataError(f"elements: expected symbols from {list(EMT_METALS)} (EMT's fcc metals), found {symbol!r}")
    if symbol in ("Cu", "Au"):
        return A_CU if symbol == "Cu" else A_AU
    return float(reference_states[atomic_numbers[symbol]]["a"])


def _structure(
    rng: np.random.Generator,
    repeat: tuple[int, int, int],
    au_fraction: float,
    max_strain: float,
    rattle: float,
    elements: tuple[str, str] = ("Cu", "Au"),
) -> Atoms:
    """One labelled alloy cell of ``elements`` (host, guest; ``au_fraction`` of the sites are the
    guest); every random number comes from ``rng`` in a fixed order."""
    a = (1.0 - au_fraction) * lattice_constant(elements[0]) + au_fraction * lattice_constant(elements[1])
    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(repeat)
    n = len(atoms)
    n_au = int(round(au_fraction * n))
    numbers = np.full(n, atomic_numbers[elements[0]], dtype=int)
    numbers[rng.permutation(n)[:n_au]] = atomic_numbers[elements[1]]
    atoms.numbers = numbers
    eps = rng.uniform(-max_strain, max_strain, size=(3, 3))
    eps = 0.5 * (eps + eps.T)
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
    atoms.positions = atoms.positions + rng.normal(0.0, rattle, size=(n, 3))
    atoms.calc = EMT()
    atoms.get_potential_energy()  # EMT computes energy, energies, forces and stress together
    results = {k: atoms.calc.results[k] for k in ("energy", "energies", "forces", "stress")}
    atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


def _check(n_structures: int, compositions: Sequence[float], max_strain: float, rattle: float) -> None:
    if isinstance(n_structures, bool) or not isinstance(n_structures, int) or n_structures < 0:
        raise DataError(f"n_structures: expected an integer >= 0, found {n_structures!r}")
    if not compositions or any(not 0.0 <= float(c) <= 1.0 for c in compositions):
        raise DataError(f"compositions: expected Au fractions in [0, 1], found {list(compositions)!r}")
    if not 0.0 <= max_strain < 0.5 or rattle < 0.0:
        raise DataError(f"expected 0 <= max_strain < 0.5 and rattle >= 0, found {max_strain!r}, {rattle!r}")


def _atoms_list(
    n_structures: int,
    seed: int,
    repeat: tuple[int, int, int],
    compositions: Sequence[float],
    max_strain: float,
    rattle: float,
    elements: tuple[str, str] = ("Cu", "Au"),
) -> list[Atoms]:
    _check(n_structures, compositions, max_strain, rattle)
    for symbol in elements:
        lattice_constant(symbol)
    rng = np.random.default_rng(seed)
    return [
        _structure(rng, repeat, float(compositions[i % len(compositions)]), max_strain, rattle, elements)
        for i in range(n_structures)
    ]


def generate_cuau_atoms(
    n_structures: int = 500,
    seed: int = 0,
    *,
    compositions: Sequence[float] = COMPOSITIONS,
    max_strain: float = 0.03,
    rattle: float = 0.05,
) -> list[Atoms]:
    """The ``CuAu_32atoms`` structures as ASE ``Atoms`` with EMT results attached.

    Args:
        n_structures: number of structures.
        seed: seed of the numpy generator; equal seeds give identical structures.
        compositions: Au fractions, used in turn (structure ``i`` has
            ``compositions[i % len(compositions)]``).
        max_strain: each component of the symmetric strain is uniform in
            ``[-max_strain, max_strain]``.
        rattle: standard deviation of the Gaussian displacement of each coordinate, Å.

    Returns:
        ``n_structures`` periodic 32-atom ``Atoms`` with a ``SinglePointCalculator`` holding
        ``energy``, ``energies [32]``, ``forces [32, 3]`` and ``stress [6]`` (Voigt, eV/Å³).

    Raises:
        DataError: on an invalid count, composition, strain or rattle.
    """
    return _atoms_list(n_structures, seed, (2, 2, 2), compositions, max_strain, rattle)


def generate_cuau(
    n_structures: int = 500,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    compositions: Sequence[float] = COMPOSITIONS,
    max_strain: float = 0.03,
    rattle: float = 0.05,
) -> list[Data]:
    """The ``CuAu_32atoms`` reference set as raw samples.

    Args:
        n_structures: number of structures.
        seed: seed; equal seeds give bit-for-bit equal samples.
        dtype: floating dtype of positions, cell and labels.
        compositions: Au fractions, used in turn.
        max_strain: bound of the uniform symmetric strain components.
        rattle: standard deviation of the position noise, Å.

    Returns:
        Samples as :func:`~hydragnn.data.io.ase_io.atoms_to_sample` builds them (N = 32):
        ``atomic_number [N, 1]``, ``pos [N, 3]``, ``cell [1, 3, 3]``, ``pbc [1, 3]``,
        ``natoms [1]``, ``energy [1, 1]``, ``energy_per_atom [1, 1]``,
        ``atomic_energy [N, 1]``, ``forces [N, 3]``, ``stress [1, 6]``.

    Raises:
        DataError: on an invalid count, composition, strain or rattle.
    """
    atoms = generate_cuau_atoms(n_structures, seed, compositions=compositions, max_strain=max_strain, rattle=rattle)
    return [atoms_to_sample(a, dtype=dtype) for a in atoms]


def bulk_repeat(n_atoms: int) -> tuple[int, int, int]:
    """Repetition ``(a, b, c)`` (``a <= b <= c``) of the 4-atom fcc cell for about ``n_atoms``.

    Among the shapes whose atom count is within 5 % of ``n_atoms`` (or, when none is, the
    closest ones) the most cubic is chosen, then the closest count: 1000 gives ``(6, 6, 7)``
    (1008 atoms), 32 gives ``(2, 2, 2)``.

    Args:
        n_atoms: wanted number of atoms (>= 4).

    Raises:
        DataError: when ``n_atoms < 4``.
    """
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, int) or n_atoms < 4:
        raise DataError(f"n_atoms: expected an integer >= 4, found {n_atoms!r}")
    cells = n_atoms / 4
    shapes = []
    for a, b in itertools.combinations_with_replacement(range(1, int(cells**0.5) + 2), 2):
        for c in {max(b, int(cells / (a * b))), max(b, int(cells / (a * b)) + 1)}:
            shapes.append((abs(4 * a * b * c - n_atoms), c - a, (a, b, c)))
    best_error = min(s[0] for s in shapes)
    tolerance = max(best_error, 0.05 * n_atoms)
    return min((s[1], s[0], s[2]) for s in shapes if s[0] <= tolerance)[2]


def generate_bulk_atoms(
    n_structures: int = 4,
    n_atoms: int = 1000,
    seed: int = 0,
    *,
    compositions: Sequence[float] = COMPOSITIONS,
    max_strain: float = 0.03,
    rattle: float = 0.05,
) -> list[Atoms]:
    """Large Cu–Au cells (about ``n_atoms`` atoms) as ``Atoms`` with EMT results: the
    :func:`generate_alloy_atoms` of ``("Cu", "Au")`` (its arguments; ``compositions`` are Au
    fractions).

    Returns:
        Periodic ``Atoms`` with a ``SinglePointCalculator`` (energy, energies, forces, stress).

    Raises:
        DataError: on invalid arguments.
    """
    return generate_alloy_atoms(
        ("Cu", "Au"), n_structures, n_atoms, seed, compositions=compositions, max_strain=max_strain, rattle=rattle
    )


def generate_alloy_atoms(
    elements: Sequence[str],
    n_structures: int = 4,
    n_atoms: int = 32,
    seed: int = 0,
    *,
    compositions: Sequence[float] = COMPOSITIONS,
    max_strain: float = 0.03,
    rattle: float = 0.05,
) -> list[Atoms]:
    """Binary fcc alloy cells of any two of :data:`EMT_METALS` (or one element alone), with EMT
    results: the recipe of :func:`generate_cuau_atoms` for another chemistry.

    Args:
        elements: ``(host, guest)`` symbols; ``compositions`` are guest fractions. One symbol
            gives cells of that element alone.
        n_structures: number of structures.
        n_atoms: wanted atom count (:func:`bulk_repeat`; 32 gives 2x2x2 conventional cells).
        seed: seed; equal seeds give identical structures.
        compositions: guest fractions, used in turn.
        max_strain: bound of the uniform symmetric strain components.
        rattle: standard deviation of the position noise, Å.

    Returns:
        Periodic ``Atoms`` with a ``SinglePointCalculator`` (energy, energies, forces, stress).

    Raises:
        DataError: an element EMT has no fcc parameters for, or invalid arguments.
    """
    pair = tuple(elements)
    if len(pair) not in (1, 2) or not all(isinstance(e, str) for e in pair):
        raise DataError(f"elements: expected one or two element symbols, found {elements!r}")
    if len(pair) == 1:
        pair, compositions = (pair[0], pair[0]), (0.0,)
    return _atoms_list(n_structures, seed, bulk_repeat(n_atoms), compositions, max_strain, rattle, (pair[0], pair[1]))


def generate_bulk(
    n_structures: int = 4,
    n_atoms: int = 1000,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    compositions: Sequence[float] = COMPOSITIONS,
    max_strain: float = 0.03,
    rattle: float = 0.05,
) -> list[Data]:
    """Large Cu–Au reference cells as raw samples, for scale tests.

    Args:
        n_structures: number of structures.
        n_atoms: wanted atom count (1000 gives 6×6×7 conventional cells, 1008 atoms).
        seed: seed; equal seeds give bit-for-bit equal samples.
        dtype: floating dtype of positions, cell and labels.
        compositions: Au fractions, used in turn.
        max_strain: bound of the uniform symmetric strain components.
        rattle: standard deviation of the position noise, Å.

    Returns:
        Samples with the layout of :func:`generate_cuau` (N about ``n_atoms``).

    Raises:
        DataError: on invalid arguments.
    """
    atoms = generate_bulk_atoms(
        n_structures, n_atoms, seed, compositions=compositions, max_strain=max_strain, rattle=rattle
    )
    return [atoms_to_sample(a, dtype=dtype) for a in atoms]


def isolated_atom_frames(symbols: Sequence[str], prefix: str = "REF_") -> list[Atoms]:
    """One EMT free atom per symbol in a 20 Å non-periodic box, labelled ``<prefix>energy`` with
    ``config_type`` ``IsolatedAtom`` (MACE's convention for reference energies)."""
    frames = []
    for symbol in symbols:
        atoms = Atoms(symbol, positions=[[10.0, 10.0, 10.0]], cell=[20.0, 20.0, 20.0], pbc=False)
        atoms.calc = EMT()
        energy = float(atoms.get_potential_energy())
        atoms.calc = None
        atoms.info[f"{prefix}energy"] = energy
        atoms.info["config_type"] = "IsolatedAtom"
        frames.append(atoms)
    return frames


def write_extxyz(
    path: str | Path,
    structures: Sequence[Atoms],
    *,
    prefix: str = "REF_",
    config_type: str | None = None,
    extra_frames: Sequence[Atoms] = (),
) -> Path:
    """Write labelled structures as an extxyz file the way DFT datasets usually are.

    Each structure's calculator results go to ``info[<prefix>energy]``,
    ``arrays[<prefix>forces]`` and ``info[<prefix>stress]`` (Voigt, eV/Å³, when present); the
    calculator itself is not written. ``extra_frames`` (isolated atoms, say) come first, as given.
    The file is replaced atomically.

    Returns:
        The path written.
    """
    import ase.io

    frames = list(extra_frames)
    for atoms in structures:
        plain = atoms.copy()
        results = atoms.calc.results if atoms.calc is not None else {}
        if "energy" in results:
            plain.info[f"{prefix}energy"] = float(results["energy"])
        if "forces" in results:
            plain.arrays[f"{prefix}forces"] = np.array(results["forces"], dtype=np.float64)
        if "stress" in results and atoms.pbc.all():
            plain.info[f"{prefix}stress"] = np.array(results["stress"], dtype=np.float64)
        if config_type is not None:
            plain.info["config_type"] = config_type
        frames.append(plain)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    ase.io.write(str(tmp), frames, format="extxyz")
    os.replace(tmp, path)
    return path
