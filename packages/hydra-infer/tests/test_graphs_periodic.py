"""Periodic CUDA-graph replay (fully periodic cells, the cell a per-call input) on CPU through the
replay backend: the engine's in-graph nvalchemi neighbour list, overflow and image-range rebuilds,
batches of cells, and molecular dynamics through the ASE calculator."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.md.verlet import VelocityVerlet
from infer_helpers import CUTOFF, tiny_model
from test_graphs import assert_same, stats

from hydragnn.infer import HydraASECalculator, HydraCalculator, HydraInferWarning
from hydragnn.infer.graphs.periodic import images_needed


def test_periodic_cell_replays_with_moving_atoms_and_a_varying_cell(model64, cuau_atoms, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    a = cuau_atoms[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fully periodic cell is eligible: no fallback warning
        for k in range(3):
            pos = a.positions + 0.03 * k
            assert_same(
                calc(pos, a.numbers, cell=a.cell.array, forces=True),
                ref(pos, a.numbers, cell=a.cell.array, forces=True),
            )
    assert stats(calc)["replays"] == 1 and list(calc.graph_engine.engines) == [("periodic", (32,), True)]
    for scale in (1.01, 0.98, 0.95):  # NPT-like: the cell is a graph input
        cell, pos = a.cell.array * scale, a.positions * scale
        got = calc(pos, a.numbers, cell=cell, forces=True)
        want = ref(pos, a.numbers, cell=cell, forces=True)
        torch.testing.assert_close(got["energy"], want["energy"], rtol=0, atol=1e-10)
        torch.testing.assert_close(got["forces"], want["forces"], rtol=0, atol=1e-10)
    s = stats(calc)
    assert s["replays"] + s["rebuilds"] == 4 and s["rejected"] == 0


def test_species_change_between_replays(model64, cuau_atoms, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    a = cuau_atoms[1]
    for _ in range(2):
        calc(a.positions, a.numbers, cell=a.cell.array, forces=True)
    swapped = np.where(a.numbers == 29, 79, 29)
    assert_same(
        calc(a.positions, swapped, cell=a.cell.array, forces=True),
        ref(a.positions, swapped, cell=a.cell.array, forces=True),
    )
    assert stats(calc)["replays"] == 1


def test_a_batch_of_cells(model64, cuau_atoms, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    coord = np.stack([cuau_atoms[0].positions, cuau_atoms[1].positions])
    numbers = np.stack([cuau_atoms[0].numbers, cuau_atoms[1].numbers])
    cells = np.stack([cuau_atoms[0].cell.array, cuau_atoms[1].cell.array])
    for shift in (0.0, 0.0, 0.02):
        out = calc(coord + shift, numbers, cell=cells, forces=True)
    assert_same(out, ref(coord + 0.02, numbers, cell=cells, forces=True))
    assert stats(calc)["replays"] == 1 and ("periodic", (32, 32), True) in calc.graph_engine.engines


def test_neighbour_overflow_and_short_image_range_rebuild(graph_calc):
    model = tiny_model()
    calc, ref = graph_calc(model), HydraCalculator(model)
    atoms = bulk("Cu", "fcc", a=4.5, cubic=True).repeat((2, 1, 1))  # 8 atoms; one periodic image suffices
    atoms.numbers[::3] = 79
    for _ in range(2):
        calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
    engine = calc.graph_engine.engines[("periodic", (8,), True)]
    assert engine.buffers["shift_range"].tolist() == [[1, 1, 1]]
    small = atoms.copy()
    # widths 3.5 and 7.0 < ... cutoff 4 needs 2 images along y, z
    small.set_cell(atoms.cell.array * 0.78, scale_atoms=True)
    assert images_needed(torch.as_tensor(small.cell.array).unsqueeze(0), CUTOFF).tolist() == [[1, 2, 2]]
    got = calc(small.positions, small.numbers, cell=small.cell.array, forces=True)
    want = ref(small.positions, small.numbers, cell=small.cell.array, forces=True)
    torch.testing.assert_close(got["forces"], want["forces"], rtol=0, atol=1e-10)
    s = stats(calc)
    assert s["overflows"] == 1 and s["rebuilds"] == 1 and s["admitted"] == 2
    new = calc.graph_engine.engines[("periodic", (8,), True)]
    assert new is not engine and new.buffers["shift_range"][0, 1:].tolist() == [2, 2]
    moved = small.positions + 0.05
    torch.testing.assert_close(
        calc(moved, small.numbers, cell=small.cell.array, forces=True)["forces"],
        ref(moved, small.numbers, cell=small.cell.array, forces=True)["forces"],
        rtol=0,
        atol=1e-10,
    )
    assert stats(calc)["replays"] == 1


def test_images_needed_matches_nvalchemi():
    from nvalchemiops.torch.neighbors.neighbor_utils import compute_naive_num_shifts

    rng = np.random.default_rng(0)
    cells = torch.as_tensor(np.eye(3) * rng.uniform(2, 9, size=(12, 1, 1)) + rng.normal(0, 0.8, size=(12, 3, 3)))
    pbc = torch.ones(12, 3, dtype=torch.bool)
    for cutoff in (2.0, 4.0, 6.5):
        shift_range, _, _ = compute_naive_num_shifts(cells, cutoff, pbc)
        assert torch.equal(images_needed(cells, cutoff), shift_range)


def test_partly_periodic_cells_and_stress_stay_regular(model64, cuau_atoms, graph_calc):
    calc = graph_calc(model64)
    a = cuau_atoms[0]
    with pytest.warns(HydraInferWarning, match="non-periodic directions"):
        calc(a.positions, a.numbers, cell=a.cell.array, pbc=[True, True, False])
    with pytest.warns(HydraInferWarning, match="stress was requested"):
        out = calc(a.positions, a.numbers, cell=a.cell.array, forces=True, stress=True)
    assert out["stress"].shape == (1, 3, 3) and stats(calc)["first_sightings"] == 0


def _md_energies(calc, atoms, steps: int) -> list[float]:
    atoms = atoms.copy()
    atoms.calc = calc
    rng = np.random.default_rng(0)
    atoms.set_velocities(rng.normal(0, 0.02, size=(len(atoms), 3)))
    dyn = VelocityVerlet(atoms, timestep=1.0)
    energies = []
    for _ in range(steps):
        dyn.run(1)
        energies.append(atoms.get_potential_energy())
    return energies


def test_cuau_md_through_the_ase_calculator_replays(cuau_atoms):
    model = tiny_model(precision="fp32")
    graphs = HydraASECalculator(model, cuda_graph=True, graph_backend="replay")
    regular = HydraASECalculator(model)
    a = cuau_atoms[2]
    got, want = _md_energies(graphs, a, 12), _md_energies(regular, a, 12)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-6 * len(a))
    s = graphs.hydra.memory_stats()
    assert s["replays"] >= 9 and s["admitted"] >= 1 and s["rejected"] == 0
