"""EMT reference data: determinism, physics, schema compatibility."""

from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
import pytest
import torch
from ase.calculators.emt import EMT

from hydragnn.data.emt import (
    CUAU_VARIABLES,
    EMT_METALS,
    bulk_repeat,
    generate_alloy_atoms,
    generate_bulk,
    generate_bulk_atoms,
    generate_cuau,
    generate_cuau_atoms,
)
from hydragnn.data.errors import DataError
from hydragnn.data.prepare import prepare
from hydragnn.data.schema import Schema

LABELS = (
    "atomic_number",
    "pos",
    "cell",
    "pbc",
    "natoms",
    "energy",
    "energy_per_atom",
    "atomic_energy",
    "forces",
    "stress",
)


@pytest.fixture(scope="module")
def cuau500():
    start = time.perf_counter()
    samples = generate_cuau(500, seed=0)
    elapsed = time.perf_counter() - start
    energies = torch.cat([s.energy_per_atom for s in samples])
    print(
        f"\nCuAu_32atoms: 500 structures in {elapsed:.2f} s; energy per atom "
        f"[{energies.min().item():.4f}, {energies.max().item():.4f}] eV"
    )
    return samples


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for key in a.keys():
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_deterministic_bit_for_bit(cuau500):
    first = generate_cuau(20, seed=0)
    second = generate_cuau(20, seed=0)
    for a, b, c in zip(first, second, cuau500[:20]):
        _assert_equal(a, b)
        _assert_equal(a, c)  # a longer run extends the same sequence
    other = generate_cuau(2, seed=1)
    assert not torch.equal(other[0].pos, first[0].pos)


def test_layout_and_compositions(cuau500):
    fractions = Counter()
    for s in cuau500:
        assert all(key in s for key in LABELS)
        assert s.pos.shape == (32, 3) and s.pos.dtype == torch.float32
        assert s.pbc.all() and s.natoms.item() == 32
        numbers = set(s.atomic_number.view(-1).tolist())
        assert numbers <= {29, 79}
        fractions[(s.atomic_number == 79).sum().item() / 32] += 1
    assert sorted(fractions) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len(set(fractions.values())) == 1  # compositions cycle evenly


def test_labels_finite_and_consistent(cuau500):
    for s in cuau500:
        for key in ("energy", "energy_per_atom", "atomic_energy", "forces", "stress"):
            assert torch.isfinite(s[key]).all(), key
        assert s.atomic_energy.double().sum().item() == pytest.approx(s.energy.item(), rel=1e-5, abs=1e-4)
        assert s.energy_per_atom.item() == pytest.approx(s.energy.item() / 32, rel=1e-6)
        assert s.forces.double().sum(0).abs().max().item() < 1e-4  # no net force
        # rattled: even a pure, strained fcc cell would have zero forces by symmetry
        assert s.forces.abs().max().item() > 1e-2
        assert s.stress.abs().max().item() > 0
    cells = torch.stack([s.cell[0].double() for s in cuau500])
    lattice = torch.tensor([3.59 + 0.25 * i * (4.056 - 3.59) for i in range(5)], dtype=torch.float64)
    unstrained = 2 * lattice.repeat(100).reshape(500, 1, 1) * torch.eye(3, dtype=torch.float64)
    strain = (cells - unstrained) / unstrained.diagonal(dim1=1, dim2=2).unsqueeze(-1)
    assert strain.abs().amax(dim=(1, 2)).min() > 1e-4  # every cell strained (Vegard constant times 1 + eps)
    assert strain.abs().max() < 0.031  # a few percent (max_strain 0.03)


def test_forces_match_finite_differences_of_emt():
    atoms = generate_cuau_atoms(1, seed=5)[0]
    sample = generate_cuau(1, seed=5, dtype=torch.float64)[0]
    assert np.array_equal(sample.forces.numpy(), atoms.get_forces())
    probe = atoms.copy()
    probe.calc = EMT()
    h = 1e-5
    for i, axis in ((0, 0), (7, 1), (31, 2)):
        energies = []
        for sign in (1.0, -1.0):
            probe.positions[i, axis] = atoms.positions[i, axis] + sign * h
            energies.append(probe.get_potential_energy())
        probe.positions[i, axis] = atoms.positions[i, axis]
        fd = -(energies[0] - energies[1]) / (2 * h)
        assert sample.forces[i, axis].item() == pytest.approx(fd, abs=1e-5)
    assert probe.get_potential_energy() == pytest.approx(sample.energy.item(), abs=1e-12)


def test_prepare_works_on_every_sample(cuau500):
    json.dumps(CUAU_VARIABLES)
    schema = Schema.from_dict(CUAU_VARIABLES)
    for i, s in enumerate(cuau500):
        data = prepare(s, schema, index=i)
        assert data.x.shape == (32, 1)
        assert data.graph_output.shape == (1, 1) and data.node_output.shape == (32, 4)
        assert data.y.shape == (1 + 32 + 96, 1)


def test_bulk_set():
    start = time.perf_counter()
    (sample,) = generate_bulk(1, n_atoms=1000, seed=0, compositions=(0.5,))
    print(f"\nbulk: 1 structure of {sample.natoms.item()} atoms in {time.perf_counter() - start:.2f} s")
    assert bulk_repeat(1000) == (6, 6, 7)
    assert sample.natoms.item() == 1008 and sample.forces.shape == (1008, 3)
    assert all(key in sample for key in LABELS)
    assert torch.isfinite(sample.forces).all() and torch.isfinite(sample.stress).all()
    assert (sample.atomic_number == 79).sum().item() == 504
    prepare(sample, Schema.from_dict(CUAU_VARIABLES))


def test_invalid_arguments():
    with pytest.raises(DataError):
        generate_cuau(-1)
    with pytest.raises(DataError):
        generate_cuau(1, compositions=(1.5,))
    with pytest.raises(DataError):
        bulk_repeat(2)
    assert generate_cuau(0) == []


def test_alloys_of_other_metals():
    """Any two of EMT's fcc metals in the Cu-Au recipe: their species only, EMT's labels, the
    guest fraction asked for; Cu-Au itself gives generate_bulk_atoms' structures bit for bit."""
    cells = generate_alloy_atoms(("Ni", "Al"), 5, 16, seed=3)
    assert [sorted(set(a.numbers.tolist())) for a in cells] == [[28], [13, 28], [13, 28], [13, 28], [13]]
    assert [int((a.numbers == 13).sum()) for a in cells] == [0, 4, 8, 12, 16]
    for atoms in cells[:2]:
        reference = atoms.copy()
        reference.calc = EMT()
        assert atoms.get_potential_energy() == pytest.approx(reference.get_potential_energy(), abs=1e-10)
    ours, theirs = generate_alloy_atoms(("Cu", "Au"), 3, 32, seed=5), generate_bulk_atoms(3, 32, seed=5)
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a.positions, b.positions) and np.array_equal(a.numbers, b.numbers)
    assert {int(z) for z in generate_alloy_atoms(["Pt"], 2, 8)[1].numbers} == {78}
    assert set(EMT_METALS) >= {"Al", "Ni", "Pd", "Ag", "Pt"}
    with pytest.raises(DataError, match="EMT's fcc metals.*'Fe'"):
        generate_alloy_atoms(("Fe", "Al"), 1, 8)
    with pytest.raises(DataError, match="one or two element symbols"):
        generate_alloy_atoms(("Ni", "Al", "Cu"), 1, 8)
