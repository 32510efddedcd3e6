"""Per-species reference energies: least squares on composition, isolated atoms, given values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import DataError
from hydragnn.data.atomic_references import (
    atomic_number_of,
    fit_average,
    format_reference_energies,
    from_isolated_atoms,
    parse_reference_energies,
)
from hydragnn.data.emt import generate_cuau


def _sample(numbers, energy):
    return Data(
        atomic_number=torch.tensor(numbers).reshape(-1, 1), energy=torch.tensor([[energy]], dtype=torch.float64)
    )


def test_average_recovers_exact_per_species_energies():
    e0 = {1: -13.6, 8: -432.1, 6: -1027.3}
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(12):
        numbers = rng.choice([1, 6, 8], size=int(rng.integers(2, 9))).tolist()
        samples.append(_sample(numbers, sum(e0[z] for z in numbers)))
    fit = fit_average(samples)
    assert fit.energies.keys() == e0.keys() and not fit.rank_deficient and fit.samples == 12
    for z, e in e0.items():
        assert abs(fit.energies[z] - e) < 1e-9
    assert fit.residual_rms < 1e-10


def test_average_on_emt_alloys_matches_numpy_least_squares():
    samples = generate_cuau(20, seed=1, dtype=torch.float64)
    fit = fit_average(samples)
    counts = np.array([[int((s.atomic_number == z).sum()) for z in (29, 79)] for s in samples], dtype=float)
    energies = np.array([float(s.energy) for s in samples])
    expected = np.linalg.lstsq(counts, energies, rcond=None)[0]
    np.testing.assert_allclose([fit.energies[29], fit.energies[79]], expected, rtol=1e-10)
    residual = (energies - counts @ expected) / counts.sum(1)
    assert fit.residual_rms == pytest.approx(float(np.sqrt((residual**2).mean())), rel=1e-10)
    assert format_reference_energies(fit.energies).startswith("Cu ") and " eV, Au " in format_reference_energies(
        fit.energies
    )


def test_one_stoichiometry_is_rank_deficient():
    samples = [_sample([29, 79] * k, -3.0 * k) for k in range(1, 5)]
    fit = fit_average(samples)
    assert fit.rank_deficient and fit.residual_rms < 1e-12  # min-norm solution, still fits
    with pytest.raises(DataError, match="no training structures"):
        fit_average([])
    with pytest.raises(DataError, match="sample 0: reference energies need 'atomic_number' and 'energy'"):
        fit_average([Data(atomic_number=torch.tensor([[1]]))])


def test_isolated_atoms():
    assert from_isolated_atoms([(29, -0.1), (79, 0.2), (29, -0.1)], {29, 79}, "f.xyz") == {29: -0.1, 79: 0.2}
    with pytest.raises(DataError, match=r"f\.xyz: no IsolatedAtom frame for \['Au'\]; found \['Cu'\]"):
        from_isolated_atoms([(29, -0.1)], {29, 79}, "f.xyz")
    with pytest.raises(DataError, match="two IsolatedAtom frames of Cu disagree"):
        from_isolated_atoms([(29, -0.1), (29, -0.2)], {29}, "f.xyz")


def test_given_by_symbol_or_number():
    assert parse_reference_energies({"Cu": -3.5, "79": -3.0, 1: -13.6}, "w") == {1: -13.6, 29: -3.5, 79: -3.0}
    assert atomic_number_of("Au", "w") == 79 and atomic_number_of(" 8", "w") == 8
    for bad, pattern in (
        ({"Qq": 1.0}, "'Qq' is neither a chemical symbol nor an atomic number"),
        ({"0": 1.0}, "'0' is not an atomic number in 1..118"),
        ({"X": 1.0}, "'X' is neither"),
        ({"Cu": "x"}, r"w\.Cu: expected a finite number"),
        ({"Cu": float("nan")}, r"w\.Cu: expected a finite number"),
        ({"Cu": 1.0, "29": 2.0}, r"Cu \(Z=29\) is given twice"),
    ):
        with pytest.raises(DataError, match=pattern):
            parse_reference_energies(bad, "w")
