"""ASE ``Atoms`` <-> raw sample conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.data import Data

from hydragnn.data.errors import SchemaError
from hydragnn.data.io.ase_io import atoms_to_sample, sample_to_atoms


def _periodic(calc: bool = True) -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    atoms.numbers[[1, 4]] = 79
    atoms.set_cell(
        atoms.cell.array @ np.array([[1.02, 0.01, 0.0], [0.01, 0.99, 0.02], [0.0, 0.02, 1.01]]), scale_atoms=True
    )
    atoms.rattle(0.05, seed=3)
    if calc:
        atoms.calc = EMT()
        atoms.get_potential_energy()
    return atoms


def _molecule(calc: bool = True) -> Atoms:
    atoms = molecule("CH4")
    if calc:
        rng = np.random.default_rng(0)
        atoms.calc = SinglePointCalculator(
            atoms, energy=-23.5, forces=rng.normal(size=(5, 3)), energies=rng.normal(size=5)
        )
    return atoms


def _assert_same(a: Atoms, b: Atoms) -> None:
    assert np.array_equal(a.numbers, b.numbers)
    assert np.array_equal(a.positions, b.positions)
    assert np.array_equal(a.cell.array, b.cell.array)
    assert np.array_equal(a.pbc, b.pbc)
    ra = a.calc.results if a.calc is not None else {}
    rb = b.calc.results if b.calc is not None else {}
    keys = {"energy", "forces", "stress", "energies"}
    assert set(ra) & keys == set(rb) & keys
    for key in set(ra) & keys:
        assert np.array_equal(np.asarray(ra[key]), np.asarray(rb[key])), key


def test_periodic_layout_and_round_trip():
    atoms = _periodic()
    s = atoms_to_sample(atoms)
    n = len(atoms)
    assert s.atomic_number.shape == (n, 1) and s.atomic_number.dtype == torch.int64
    assert s.pos.shape == (n, 3) and s.pos.dtype == torch.float64
    assert s.cell.shape == (1, 3, 3) and s.pbc.shape == (1, 3) and s.pbc.dtype == torch.bool
    assert s.natoms.tolist() == [n]
    assert s.energy.shape == (1, 1) and s.energy_per_atom.shape == (1, 1)
    assert s.atomic_energy.shape == (n, 1) and s.forces.shape == (n, 3) and s.stress.shape == (1, 6)
    assert s.energy_per_atom.item() == pytest.approx(s.energy.item() / n, rel=1e-15)
    back = sample_to_atoms(s)
    _assert_same(atoms, back)
    assert isinstance(back.calc, SinglePointCalculator)
    assert back.get_potential_energy() == atoms.get_potential_energy()


def test_molecule_has_no_cell_and_round_trips():
    atoms = _molecule()
    s = atoms_to_sample(atoms)
    assert "cell" not in s and s.pbc.tolist() == [[False, False, False]]
    assert "stress" not in s
    _assert_same(atoms, sample_to_atoms(s))


@pytest.mark.parametrize("make", [_periodic, _molecule])
def test_round_trip_without_results(make):
    atoms = make(calc=False)
    s = atoms_to_sample(atoms)
    for key in ("energy", "energy_per_atom", "atomic_energy", "forces", "stress"):
        assert key not in s
    back = sample_to_atoms(s)
    assert back.calc is None
    _assert_same(atoms, back)


def test_reading_results_does_not_calculate():
    atoms = _periodic(calc=False)
    atoms.calc = EMT()  # attached but never run
    s = atoms_to_sample(atoms)
    assert "energy" not in s and "forces" not in s


def test_stale_results_are_ignored():
    atoms = _periodic()
    atoms.positions[0, 0] += 0.1
    with pytest.warns(UserWarning, match="positions"):
        s = atoms_to_sample(atoms)
    assert "energy" not in s and "forces" not in s


def test_stress_voigt_order():
    atoms = _periodic()
    full = atoms.get_stress(voigt=False)
    s = atoms_to_sample(atoms)
    xx, yy, zz, yz, xz, xy = s.stress[0].tolist()
    assert [xx, yy, zz] == [full[0, 0], full[1, 1], full[2, 2]]
    assert [yz, xz, xy] == [full[1, 2], full[0, 2], full[0, 1]]
    assert abs(xy) > 0  # a sheared cell has off-diagonal stress
    # a calculator storing the full 3x3 tensor gives the same Voigt vector
    spc = _periodic(calc=False)
    spc.calc = SinglePointCalculator(spc, stress=full)
    assert torch.equal(atoms_to_sample(spc).stress, s.stress)


def test_per_atom_energies_sum_to_energy():
    s = atoms_to_sample(_periodic())
    assert s.atomic_energy.sum().item() == pytest.approx(s.energy.item(), abs=1e-10)


def test_info_and_arrays_conventions():
    atoms = _molecule(calc=False)
    atoms.info["energy"] = -1.25
    atoms.arrays["forces"] = np.ones((5, 3))
    s = atoms_to_sample(atoms)
    assert s.energy.item() == -1.25 and torch.equal(s.forces, torch.ones(5, 3, dtype=torch.float64))


def test_float32_and_energy_per_atom_fallback():
    s = atoms_to_sample(_periodic(), dtype=torch.float32)
    assert s.pos.dtype == s.cell.dtype == s.forces.dtype == s.energy.dtype == torch.float32
    del s.energy
    back = sample_to_atoms(s)
    assert back.get_potential_energy() == pytest.approx(s.energy_per_atom.item() * len(back))
    with pytest.raises(SchemaError):
        atoms_to_sample(_periodic(), dtype=torch.int64)


def test_sample_to_atoms_rejects_bad_input():
    with pytest.raises(SchemaError, match="atomic_number"):
        sample_to_atoms(Data(pos=torch.zeros(2, 3)))
    with pytest.raises(SchemaError, match="forces"):
        sample_to_atoms(
            Data(atomic_number=torch.ones(2, 1, dtype=torch.long), pos=torch.zeros(2, 3), forces=torch.zeros(3, 3))
        )
