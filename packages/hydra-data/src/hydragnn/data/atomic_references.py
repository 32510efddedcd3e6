"""Per-species reference energies (MACE's "E0s"): fitted, read from isolated atoms, or given.

An interatomic potential predicts ``E = sum_i (e0[Z_i] + e_i)``; a good ``e0`` removes the large
composition-dependent part of the total energy so the network learns only the interaction.
Three sources, all returning ``{atomic number: energy in eV}``:

* :func:`fit_average`: least squares of the training energies on the composition
  (``E_s ~ sum_Z n_sZ e0_Z``), MACE's ``E0s="average"``;
* :func:`from_isolated_atoms`: the energies of ``IsolatedAtom`` frames;
* :func:`parse_reference_energies`: values given by symbol (``"Cu"``) or atomic number (``"29"``).

Importing this module loads no torch (the config parser reads given values with it); the fit
imports torch when it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ase.data import atomic_numbers, chemical_symbols

from .errors import DataError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ReferenceFit",
    "atomic_number_of",
    "fit_average",
    "format_reference_energies",
    "from_isolated_atoms",
    "parse_reference_energies",
]


def atomic_number_of(key: Any, where: str) -> int:
    """The atomic number of a symbol (``"Cu"``) or a number (``29``, ``"29"``).

    Raises:
        DataError: naming ``where`` for an unknown symbol or a number outside 1..118.
    """
    if isinstance(key, str) and key in atomic_numbers and key != "X":
        return atomic_numbers[key]
    try:
        z = int(key)
    except (TypeError, ValueError):
        raise DataError(f"{where}: {key!r} is neither a chemical symbol nor an atomic number") from None
    if isinstance(key, bool) or str(z) != str(key).strip() or not 1 <= z < len(chemical_symbols):
        raise DataError(f"{where}: {key!r} is not an atomic number in 1..{len(chemical_symbols) - 1}")
    return z


def parse_reference_energies(values: Mapping[Any, Any], where: str) -> dict[int, float]:
    """``{"Cu": -3.7, "79": -3.1}`` -> ``{29: -3.7, 79: -3.1}``.

    Raises:
        DataError: an unknown species, a species given twice, or a value that is not a finite number.
    """
    out: dict[int, float] = {}
    for key, value in values.items():
        z = atomic_number_of(key, where)
        if z in out:
            raise DataError(f"{where}: {chemical_symbols[z]} (Z={z}) is given twice")
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value != value
            or abs(value) == float("inf")
        ):
            raise DataError(f"{where}.{key}: expected a finite number (eV), found {value!r}")
        out[z] = float(value)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class ReferenceFit:
    """A least-squares fit of energies on composition.

    Attributes:
        energies: ``{Z: e0}`` in eV.
        samples: structures fitted.
        residual_rms: RMS of ``(E - sum n e0) / N`` over the structures, eV/atom.
        rank_deficient: the compositions do not determine every ``e0`` (e.g. one fixed
            stoichiometry); the minimum-norm solution is returned.
    """

    energies: dict[int, float]
    samples: int
    residual_rms: float
    rank_deficient: bool


def _composition(samples: Sequence[Any], energy: str) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    species: set[int] = set()
    zs, es = [], []
    for i, s in enumerate(samples):
        z = getattr(s, "atomic_number", None)
        e = getattr(s, energy, None)
        if z is None or e is None:
            raise DataError(f"sample {i}: reference energies need 'atomic_number' and {energy!r}; it lacks one")
        z = z.reshape(-1).long()
        zs.append(z)
        es.append(float(torch.as_tensor(e).reshape(-1)[0]))
        species.update(z.tolist())
    order = sorted(species)
    column = {z: j for j, z in enumerate(order)}
    counts = torch.zeros(len(samples), len(order), dtype=torch.float64)
    for i, z in enumerate(zs):
        for value, count in zip(*torch.unique(z, return_counts=True)):
            counts[i, column[int(value)]] = float(count)
    natoms = counts.sum(dim=1)
    return order, counts, torch.tensor(es, dtype=torch.float64), natoms


def fit_average(samples: Sequence[Any], energy: str = "energy") -> ReferenceFit:
    """Least-squares ``e0`` from the samples' total energies (``samples[i].<energy>``) and atomic numbers.

    Raises:
        DataError: no samples, or a sample without atomic numbers or energy.
    """
    if not samples:
        raise DataError("reference energies: no training structures to fit them on")
    import torch

    order, counts, energies, natoms = _composition(samples, energy)
    solution = torch.linalg.lstsq(counts, energies.unsqueeze(1), driver="gelsd")
    e0 = solution.solution.squeeze(1)
    residual = (energies - counts @ e0) / natoms.clamp(min=1)
    rank = int(torch.linalg.matrix_rank(counts))
    return ReferenceFit(
        energies={z: float(e) for z, e in zip(order, e0.tolist())},
        samples=len(samples),
        residual_rms=float(residual.pow(2).mean().sqrt()),
        rank_deficient=rank < len(order),
    )


def from_isolated_atoms(isolated: Iterable[tuple[int, float]], species: Iterable[int], where: str) -> dict[int, float]:
    """``{Z: e0}`` from ``(Z, energy)`` pairs of isolated-atom frames.

    Raises:
        DataError: a species of the data without an isolated-atom energy, or two different
            energies for one species (naming ``where``).
    """
    table: dict[int, float] = {}
    for z, e in isolated:
        if z in table and abs(table[z] - e) > 1e-8 * max(1.0, abs(e)):
            raise DataError(
                f"{where}: two IsolatedAtom frames of {chemical_symbols[z]} disagree ({table[z]} vs {e} eV)"
            )
        table[z] = float(e)
    missing = sorted(set(species) - set(table))
    if missing:
        raise DataError(
            f"{where}: no IsolatedAtom frame for {[chemical_symbols[z] for z in missing]}; found "
            f"{[chemical_symbols[z] for z in sorted(table)]} (use reference_energies 'average' or give the values)"
        )
    return dict(sorted(table.items()))


def format_reference_energies(energies: Mapping[int, float]) -> str:
    """``Cu -3.70212 eV, Au -3.10144 eV``."""
    return ", ".join(f"{chemical_symbols[z]} {e:.6g} eV" for z, e in sorted(energies.items()))
