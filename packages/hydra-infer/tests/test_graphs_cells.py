"""The cell-list search of the sparse and periodic CUDA-graph engines (:mod:`hydragnn.infer.graphs.cells`),
on the CPU replay backend: the same pairs as the reference neighbour list on triclinic cells and
open batches, the engines equal to the regular path, and every overflow rebuilding the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from infer_helpers import CUTOFF, cluster, tiny_model

from hydragnn.data.neighbors import brute_force_radius_graph
from hydragnn.infer import HydraCalculator
from hydragnn.infer.graphs.cells import Grid, plan_grid, search

RADIUS = 3.0


def _pairs(src, dst, shift) -> set[tuple[int, int, tuple[float, ...]]]:
    return {(int(s), int(d), tuple(np.round(v, 6))) for s, d, v in zip(src.tolist(), dst.tolist(), shift.tolist())}


def _search_pairs(pos, batch, num_graphs, cell):
    grid = plan_grid(pos, batch, num_graphs, cell, RADIUS)
    assert isinstance(grid, Grid)
    found = search(pos, batch, cell, grid.buffers(), grid.total, grid.capacity, RADIUS, capacity=200_000)
    assert int(found.count) <= 200_000 and int(found.fullest) <= grid.capacity and not bool(found.lost)
    real = found.src < pos.shape[0]
    src, dst, image = found.src[real], found.dst[real], found.image[real]
    shift = (
        torch.einsum("ek,ekj->ej", image.to(pos.dtype), cell[batch[dst]])
        if cell is not None
        else torch.zeros(len(src), 3)
    )
    return src, dst, shift


def _triclinic(seed: int, repeat: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """A sheared, strained Cu-Au supercell with rattled atoms, some outside the cell."""
    atoms = bulk("Cu", "fcc", a=3.6).repeat((repeat + 1, repeat, repeat + 2))
    rng = np.random.default_rng(seed)
    cell = atoms.cell.array @ (np.eye(3) + 0.15 * rng.standard_normal((3, 3)))
    atoms.set_cell(cell, scale_atoms=True)
    atoms.positions += (
        rng.normal(scale=0.3, size=atoms.positions.shape) + rng.integers(-1, 2, (len(atoms), 1)) @ cell[:1]
    )
    return torch.as_tensor(atoms.positions), torch.as_tensor(atoms.cell.array)


@pytest.mark.parametrize("seed", range(4))
def test_periodic_cell_list_finds_the_reference_pairs(seed):
    pos, cell = _triclinic(seed)
    batch = torch.zeros(len(pos), dtype=torch.long)
    if plan_grid(pos, batch, 1, cell.unsqueeze(0), RADIUS) is None:
        pytest.skip("this draw's cell is under 3 radii wide")
    got = _pairs(*_search_pairs(pos, batch, 1, cell.unsqueeze(0)))
    edge_index, shift = brute_force_radius_graph(pos, RADIUS, cell=cell)
    assert got == _pairs(edge_index[0], edge_index[1], shift) and len(got) > 4 * len(pos)


def test_open_batch_cell_list_finds_the_reference_pairs():
    """Structures of a batch overlap in space but never pair; a sparse structure gets wider bins."""
    rng = np.random.default_rng(0)
    parts = [rng.uniform(0, 12, (300, 3)), rng.uniform(2, 9, (150, 3)), rng.uniform(0, 400, (40, 3))]
    pos = torch.as_tensor(np.concatenate(parts))
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([len(p) for p in parts]))
    grid = plan_grid(pos, batch, 3, None, RADIUS)
    assert grid is not None and grid.total <= 4 * len(pos) + 3 * 27
    got = _pairs(*_search_pairs(pos, batch, 3, None))
    edge_index, shift = brute_force_radius_graph(pos, RADIUS, batch=batch)
    assert got == _pairs(edge_index[0], edge_index[1], shift) and len(got) > len(pos)


def test_small_cells_keep_the_naive_search():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))  # 7.2 A wide: 2 bins of 3 A
    cell = torch.as_tensor(atoms.cell.array).unsqueeze(0)
    assert plan_grid(torch.as_tensor(atoms.positions), torch.zeros(32, dtype=torch.long), 1, cell, RADIUS) is None


def _periodic_atoms(repeat: int = 4):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((repeat, repeat, repeat))  # 14.4 A for CUTOFF 4: 3 bins
    atoms.numbers[::3] = 79
    atoms.rattle(0.05, seed=1)
    return atoms


def _same(got, want):
    torch.testing.assert_close(got["energy"], want["energy"], rtol=0, atol=1e-9)
    torch.testing.assert_close(got["forces"], want["forces"], rtol=0, atol=1e-10)


def test_periodic_engine_on_a_cell_list_replays_and_rebuilds(graph_calc):
    model = tiny_model()
    calc, ref = graph_calc(model), HydraCalculator(model)
    atoms = _periodic_atoms()
    for _ in range(2):
        calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
    engine = calc.graph_engine.engines[("periodic", (len(atoms),), True)]
    assert engine.grid is not None and engine.grid.dims.tolist() == [[3, 3, 3]]
    # atoms moved through the cell's faces: wrapped in the search, unwrapped in the edges
    moved = atoms.positions + np.where(np.arange(len(atoms))[:, None] % 5 == 0, atoms.cell.array[0], 0.0) + 0.02
    _same(
        calc(moved, atoms.numbers, cell=atoms.cell.array, forces=True),
        ref(moved, atoms.numbers, cell=atoms.cell.array, forces=True),
    )
    assert calc.memory_stats()["replays"] == 1
    # a sheared cell: still 3 bins wide, the same engine
    sheared = atoms.cell.array + np.array([[0, 0, 0], [0.5, 0, 0], [0, 0.4, 0]])
    _same(
        calc(atoms.positions, atoms.numbers, cell=sheared, forces=True),
        ref(atoms.positions, atoms.numbers, cell=sheared, forces=True),
    )
    assert calc.memory_stats()["replays"] == 2 and calc.memory_stats()["overflows"] == 0
    # a cell shrunk beyond its bins' margin: rebuilt on the naive search (now 2 bins wide)
    small = atoms.cell.array * 0.8
    scaled = atoms.positions * 0.8
    _same(calc(scaled, atoms.numbers, cell=small, forces=True), ref(scaled, atoms.numbers, cell=small, forces=True))
    stats = calc.memory_stats()
    assert stats["overflows"] == 1 and stats["rebuilds"] == 1
    assert calc.graph_engine.engines[engine.key].grid is None


def test_periodic_cell_list_overflow_rebuilds(graph_calc):
    """Atoms crowding into one bin overflow the bin table and the edge buffer: the cache rebuilds."""
    model = tiny_model()
    calc, ref = graph_calc(model), HydraCalculator(model)
    atoms = _periodic_atoms()
    for _ in range(2):
        calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
    engine = calc.graph_engine.engines[("periodic", (len(atoms),), True)]
    crowded = atoms.positions.copy()
    crowded[:40] = crowded[:40] * 0.25 + 1.0  # 40 atoms pulled into the first bins
    _same(
        calc(crowded, atoms.numbers, cell=atoms.cell.array, forces=True),
        ref(crowded, atoms.numbers, cell=atoms.cell.array, forces=True),
    )
    assert calc.memory_stats()["overflows"] == 1
    new = calc.graph_engine.engines[engine.key]
    assert new.grid is not None and new.grid.capacity > engine.grid.capacity


def test_sparse_engine_rebuilds_when_an_atom_leaves_its_grid(graph_calc):
    model = tiny_model()
    calc, ref = graph_calc(model, nb_threshold=8), HydraCalculator(model)
    pos, z = cluster(40, seed=3)
    for _ in range(2):
        calc(pos, z, forces=True)
    engine = next(iter(calc.graph_engine.engines.values()))
    assert engine.kind == "sparse" and engine.grid.total >= 1
    inside = pos + 0.3
    _same(calc(inside, z, forces=True), ref(inside, z, forces=True))
    assert calc.memory_stats()["overflows"] == 0
    away = pos.copy()
    away[0] += 4 * CUTOFF  # beyond the spare bin
    _same(calc(away, z, forces=True), ref(away, z, forces=True))
    assert calc.memory_stats()["overflows"] == 1 and calc.memory_stats()["rebuilds"] == 1
