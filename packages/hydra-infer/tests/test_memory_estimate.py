"""The calculator estimates a call's edges from each structure's density before the neighbour
search, refuses beyond ``max_edges`` with the numbers, and turns a failed allocation into an
InferenceError that names them."""

from __future__ import annotations

import time

import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk, molecule

from hydragnn.infer import HydraCalculator, InferenceError
from hydragnn.infer.memory import estimated_edges
from hydragnn.models import save_artifact


def _edges(calc, atoms) -> tuple[int, int]:
    """(estimate, edges the neighbour search builds) of one structure."""
    cell = atoms.cell.array if atoms.pbc.any() else None
    call = calc._check(atoms.positions, atoms.numbers, None, cell, None, None)
    estimate = estimated_edges(call.pos, call.batch, 1, call.cell, call.pbc, calc.info.cutoff, calc.info.max_neighbours)
    return estimate[0], int(calc.build_batch(call).edge_index.shape[1])


def test_the_estimate_follows_the_edges_the_search_builds(model64):
    calc = HydraCalculator(model64, species=[1, 6, 8, 29, 79])
    cluster = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(4)
    cluster.pbc = False
    for atoms in (bulk("Cu", "fcc", a=3.6, cubic=True).repeat(5), bulk("Au", "fcc", a=4.08).repeat(3), cluster):
        estimate, real = _edges(calc, atoms)
        assert 0.5 * real <= estimate <= 2.0 * real, (atoms.get_chemical_formula(), estimate, real)
    estimate, real = _edges(calc, molecule("CH3CH2OH"))
    assert real <= estimate <= len(molecule("CH3CH2OH")) * 8  # a molecule: at most every pair


def test_a_structure_far_denser_than_matter_is_refused_at_once(model64, tmp_path, capsys):
    rng = np.random.default_rng(0)
    pos, numbers, cell = rng.random((8000, 3)) * 8.0, np.full(8000, 29), np.eye(3) * 8.0
    calc = HydraCalculator(model64)
    start = time.perf_counter()
    with pytest.raises(
        InferenceError,
        match=r"would build about [\d,]+ edges, more than max_edges=20,000,000 \(structure 0: 8000 atoms",
    ):
        calc(pos, numbers, cell=cell, forces=True)
    assert time.perf_counter() - start < 5
    small = HydraCalculator(model64, max_edges=1000)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(3)
    with pytest.raises(InferenceError, match="more than max_edges=1,000"):
        small(atoms.positions, atoms.numbers, cell=atoms.cell.array)
    HydraCalculator(model64, max_edges=None)(atoms.positions, atoms.numbers, cell=atoms.cell.array)
    mol = molecule("CH3CH2OH")  # no cell: estimated only when its pairs could pass the limit
    HydraCalculator(model64, species=[1, 6, 8], max_edges=81)(mol.positions, mol.numbers)  # 9 atoms: 81 pairs
    with pytest.raises(InferenceError, match="more than max_edges=10"):
        HydraCalculator(model64, species=[1, 6, 8], max_edges=10)(mol.positions, mol.numbers)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(InferenceError, match="max_edges: expected an integer >= 1 or None"):
            HydraCalculator(model64, max_edges=bad)
    # hydragnn-evaluate goes through the same call
    from ase import Atoms

    from hydragnn.infer.evaluate_cli import main as evaluate_main

    dense = Atoms(numbers=numbers, positions=pos, cell=cell, pbc=True)
    dense.info["REF_energy"] = 0.0
    ase.io.write(tmp_path / "dense.extxyz", [dense])
    path = save_artifact(model64, tmp_path / "m.hydra", species=[29, 79])
    assert evaluate_main([str(path), str(tmp_path / "dense.extxyz"), "--energy-key", "REF_energy"]) != 0
    assert "more than max_edges=20,000,000" in capsys.readouterr().err


def test_a_neighbour_cap_does_not_hide_the_search(tmp_path):
    """20,000 atoms in a 12 Å cube with max_neighbours 100: the model would keep 2 million edges,
    but the search lists every pair within the cutoff first: refused on the uncapped count."""
    from infer_helpers import tiny_model

    calc = HydraCalculator(tiny_model(max_neighbours=100))
    rng = np.random.default_rng(1)
    with pytest.raises(InferenceError, match=r"more than max_edges=20,000,000 \(structure 0: 20000 atoms"):
        calc(rng.random((20_000, 3)) * 12.0, np.full(20_000, 29), cell=np.eye(3) * 12.0)


def test_a_failed_allocation_names_the_call(model64, monkeypatch):
    calc = HydraCalculator(model64)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(calc.runner, "run", exhausted)
    with pytest.raises(
        InferenceError, match=r"out of memory for 32 atoms \(about [\d,]+ edges estimated\): CUDA out of memory"
    ):
        calc(atoms.positions, atoms.numbers, cell=atoms.cell.array)
