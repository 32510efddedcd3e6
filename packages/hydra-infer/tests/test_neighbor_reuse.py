"""Neighbour-list reuse with a Verlet skin (``skin``): same edges and outputs as a fresh list,
per structure of a batch, with wrapped atoms and strained cells.

MD measurement (untrained fp64 SchNet, cutoff 4 Å, VelocityVerlet 1 fs, 300 K, 80 steps, seed 0;
skin 0.5 Å): the periodic 32-atom Cu-Au cell and the 20-atom free cluster each take 2 builds and
79 reuses for 81 calls (asserted: at most 10 builds); energies and forces equal skin 0's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet
from infer_helpers import CUTOFF, cluster, tiny_model

from hydragnn.data.neighbors import radius_graph
from hydragnn.infer import HydraASECalculator, HydraCalculator, InferenceError
from hydragnn.infer.neighbors import MD_SKIN

SKIN = 0.5
STEPS = 80


def _md(atoms: Atoms, calc: HydraASECalculator) -> tuple[list[float], list[np.ndarray]]:
    """Energies and forces of every MD step (the initial geometry included)."""
    atoms = atoms.copy()
    atoms.calc = calc
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    energies: list[float] = []
    forces: list[np.ndarray] = []

    def record() -> None:
        energies.append(atoms.get_potential_energy())
        forces.append(atoms.get_forces().copy())

    dyn.attach(record, interval=1)
    dyn.run(STEPS)
    return energies, forces


@pytest.mark.parametrize("system", ["periodic", "cluster"])
def test_md_with_skin_equals_fresh_lists(model64, cuau_atoms, system):
    if system == "periodic":
        atoms = cuau_atoms[0].copy()
    else:
        pos, z = cluster(20, seed=3)
        atoms = Atoms(numbers=z, positions=pos)
    fresh = HydraASECalculator(model64, skin=0.0)
    reused = HydraASECalculator(model64)  # the MD default
    assert reused.hydra.skin == MD_SKIN == SKIN
    e0, f0 = _md(atoms, fresh)
    e1, f1 = _md(atoms, reused)
    np.testing.assert_allclose(e1, e0, rtol=1e-10, atol=0)
    np.testing.assert_allclose(np.stack(f1), np.stack(f0), rtol=1e-10, atol=1e-12)
    assert fresh.hydra.neighbor_stats == {"builds": STEPS + 1, "reuses": 0}
    stats = reused.hydra.neighbor_stats
    assert stats["builds"] + stats["reuses"] == STEPS + 1
    assert stats["builds"] <= (STEPS + 1) // 8, stats


def _edges_equal_fresh(calc: HydraCalculator, pos, z, cell=None, pbc=None) -> None:
    """The calculator's batch has exactly the edges (and shifts) of a fresh list within the cutoff."""
    call = calc._check(pos, z, None, cell, pbc, None)
    batch = calc.build_batch(call)
    ei, shift = radius_graph(call.pos, CUTOFF, batch=call.batch, cell=call.cell, pbc=call.pbc)
    assert torch.equal(batch.edge_index, ei)
    if cell is not None:
        assert torch.equal(batch.edge_shift, shift)


@pytest.mark.parametrize("system", ["periodic", "cluster"])
def test_rebuild_criterion(model64, cuau_atoms, system):
    if system == "periodic":
        atoms = cuau_atoms[1]
        pos, z, cell = atoms.positions.copy(), atoms.numbers.copy(), atoms.cell.array.copy()
    else:
        pos, z = cluster(16, seed=2)
        cell = None
    calc = HydraCalculator(model64, skin=SKIN)
    fresh = HydraCalculator(model64)

    def step(p, numbers=z, c=cell, pbc=None, expect="reuses"):
        before = calc.neighbor_stats
        out = calc(p, numbers, cell=c, pbc=pbc, forces=True)
        ref = fresh(p, numbers, cell=c, pbc=pbc, forces=True)
        after = calc.neighbor_stats
        assert after[expect] == before[expect] + 1, (expect, before, after)
        torch.testing.assert_close(out["energy"], ref["energy"], rtol=1e-12, atol=0)
        torch.testing.assert_close(out["forces"], ref["forces"], rtol=1e-12, atol=1e-14)
        _edges_equal_fresh(calc, p, numbers, c, pbc)

    step(pos, expect="builds")
    direction = np.array([0.6, -0.48, 0.64])  # unit vector
    below, above = pos.copy(), pos.copy()
    below[0] += 0.999 * SKIN / 2 * direction
    above[0] += 1.001 * SKIN / 2 * direction
    step(below)
    step(pos)  # back where the list was built
    step(above, expect="builds")  # measured from the last build (pos)
    step(above)
    swapped = z.copy()
    swapped[3] = 79 if swapped[3] == 29 else 29
    step(above, numbers=swapped, expect="builds")
    step(above[1:], numbers=z[1:], expect="builds")  # one atom fewer
    if cell is not None:
        step(above + (cell[0] - cell[2]) * (np.arange(len(z)) == 0)[:, None])  # atom 0 wrapped: not moved
        step(above, c=cell * 1.001)  # a small strain: cutoff / 1.001 + 2 max|d| < cutoff + skin
        step(above * 0.9, c=cell * 0.9)  # affine compression: cutoff / 0.9 < cutoff + skin
        step(above * 0.85, c=cell * 0.85, expect="builds")  # cutoff / 0.85 > cutoff + skin
        step(above, pbc=[True, True, False], expect="builds")
        step(above, pbc=[True, True, False])
        moved = above.copy()
        moved[0] += cell[2]  # a lattice vector along a direction that is not periodic: moved
        step(moved, pbc=[True, True, False], expect="builds")


def test_batched_calls_reuse(model64):
    """Dense and flat batches: one list for the whole call, rebuilt when any structure's atom moved too far."""
    (pa, za), (pb, zb) = cluster(12, seed=4), cluster(12, seed=5)
    coord, numbers = np.stack([pa, pb]), np.stack([za, zb])
    calc, fresh = HydraCalculator(model64, skin=SKIN), HydraCalculator(model64)
    rng = np.random.default_rng(1)
    for _ in range(4):
        out = calc(coord, numbers, forces=True)
        ref = fresh(coord, numbers, forces=True)
        torch.testing.assert_close(out["forces"], ref["forces"], rtol=1e-12, atol=1e-14)
        coord = coord + rng.uniform(-0.02, 0.02, size=coord.shape)
    assert calc.neighbor_stats == {"builds": 1, "reuses": 3}
    coord[1, 5] += 0.3
    calc(coord, numbers, forces=True)
    flat, mol_idx = coord.reshape(-1, 3), np.repeat([0, 1], 12)
    out = calc(flat, numbers.reshape(-1), mol_idx=mol_idx, forces=True)
    torch.testing.assert_close(out["energy"], fresh(coord, numbers)["energy"], rtol=1e-12, atol=0)
    assert calc.neighbor_stats == {"builds": 2, "reuses": 4}  # the flat call has the dense call's signature


def test_batched_call_searches_only_the_moved_structure(model64, cuau_atoms, monkeypatch):
    """Each structure keeps its own list: moving an atom of structure 1 searches structure 1 alone;
    wrapping an atom of structure 2 by a lattice vector searches nothing; outputs equal fresh lists."""
    from hydragnn.infer import neighbors

    systems = cuau_atoms[:3]
    pos = np.concatenate([a.positions for a in systems])
    z = np.concatenate([a.numbers for a in systems])
    cells = np.stack([a.cell.array for a in systems])
    mol_idx = np.repeat(np.arange(3), [len(a) for a in systems])
    start = np.cumsum([0] + [len(a) for a in systems])
    moved = pos.copy()
    moved[start[1] + 5] += [0.3, 0.0, 0.0]
    wrapped = moved.copy()
    wrapped[start[2] + 3] += cells[2][0]
    steps = [pos, moved, wrapped]
    fresh = HydraCalculator(model64)
    refs = [fresh(p, z, cell=cells, mol_idx=mol_idx, forces=True) for p in steps]
    searched: list[int] = []

    def recording(p, *args, **kwargs):
        searched.append(p.shape[0])
        return radius_graph(p, *args, **kwargs)

    monkeypatch.setattr(neighbors, "radius_graph", recording)
    calc = HydraCalculator(model64, skin=SKIN)
    for p, ref in zip(steps, refs, strict=True):
        out = calc(p, z, cell=cells, mol_idx=mol_idx, forces=True)
        assert torch.equal(out["energy"], ref["energy"])
        assert torch.equal(out["forces"], ref["forces"])
    assert searched == [len(pos), len(systems[1])]
    assert calc.neighbor_stats == {"builds": 2, "reuses": 1}


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("pbc", [(True, True, True), (True, True, False)])
def test_random_walk_gives_fresh_edges(cuau_atoms, precision, pbc):
    """Two cells in one flat call, atoms wrapped back into the cell every step, cells strained every
    fifth: the kept lists give exactly the edges and shifts of a fresh search, while being reused."""
    calc = HydraCalculator(tiny_model(precision=precision), skin=SKIN)
    systems = cuau_atoms[2:4]
    pos = np.concatenate([a.positions for a in systems])
    z = np.concatenate([a.numbers for a in systems])
    cells = np.stack([a.cell.array for a in systems])
    mol_idx = np.repeat(np.arange(2), [len(a) for a in systems])
    rng = np.random.default_rng(0)
    for step in range(60):
        pos = pos + rng.normal(0.0, 0.03, pos.shape)
        if step % 5 == 4:
            strain = np.eye(3) + rng.normal(0.0, 0.004, (2, 3, 3))
            strain = (strain + strain.transpose(0, 2, 1)) / 2
            cells = cells @ strain
            pos = np.einsum("nd,nde->ne", pos, strain[mol_idx])
        frac = np.einsum("nd,nde->ne", pos, np.linalg.inv(cells)[mol_idx])
        frac[:, list(pbc)] %= 1.0  # torch-sim's wrap, along periodic directions
        pos = np.einsum("nd,nde->ne", frac, cells[mol_idx])
        call = calc._check(pos, z, None, cells, list(pbc), mol_idx)
        edge_index, shift = calc._neighbors.edges(call, CUTOFF, None)
        ref_index, ref_shift = radius_graph(call.pos, CUTOFF, batch=call.batch, cell=call.cell, pbc=call.pbc)
        assert torch.equal(edge_index, ref_index), step
        assert torch.equal(shift, ref_shift), step
    stats = calc.neighbor_stats
    assert stats["reuses"] > 2 * stats["builds"], stats


def test_calls_that_always_rebuild(model64):
    """No reuse, same results: a neighbour cap, coordinates requiring grad, a cell too thin for cutoff + skin."""
    pos, z = cluster(10, seed=6)
    capped = HydraCalculator(tiny_model(max_neighbours=4), skin=SKIN)
    for _ in range(2):
        capped(pos, z, forces=True)
    assert capped.neighbor_stats == {"builds": 2, "reuses": 0}
    calc = HydraCalculator(model64, skin=SKIN)
    coord = torch.tensor(pos, requires_grad=True)
    for _ in range(2):
        calc(coord, z, forces=True)
    assert calc.neighbor_stats == {"builds": 2, "reuses": 0}
    thin = np.diag([0.52, 6.0, 6.0])  # 8 images reach 4.16 Å >= cutoff, not 4.5 Å
    calc = HydraCalculator(model64, skin=SKIN)
    ref = HydraCalculator(model64)(pos[:2], z[:2], cell=thin, forces=True)
    for _ in range(2):
        out = calc(pos[:2], z[:2], cell=thin, forces=True)
    torch.testing.assert_close(out["forces"], ref["forces"], rtol=1e-12, atol=1e-14)
    assert calc.neighbor_stats == {"builds": 2, "reuses": 0}


def test_modes_keep_working_with_a_skin(model64, graph_calc):
    """The compiled forward takes the reused edges; CUDA-graph replay builds its own (through the replay backend)."""
    pos, z = cluster(12, seed=7)
    fresh = HydraCalculator(model64)
    for calc in (HydraCalculator(model64, skin=SKIN, compile_model=True), graph_calc(model64, skin=SKIN)):
        for k in range(4):
            p = pos + 0.01 * k
            out, ref = calc(p, z, forces=True), fresh(p, z, forces=True)
            torch.testing.assert_close(out["energy"], ref["energy"], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(out["forces"], ref["forces"], rtol=1e-7, atol=1e-8)
        assert calc.neighbor_stats["builds"] == 1


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, "0.5", True, None, torch.tensor([0.5, 0.5])])
def test_bad_skin_is_refused(model64, bad):
    with pytest.raises(InferenceError, match="skin"):
        HydraCalculator(model64, skin=bad)
    calc = HydraCalculator(model64)
    with pytest.raises(InferenceError, match="skin"):
        calc.skin = bad
    if bad is not None:
        with pytest.raises(InferenceError, match="skin"):
            HydraASECalculator(model64, skin=bad)


def test_adapters_pass_the_skin(model64):
    assert HydraCalculator(model64).skin == 0.0
    assert HydraASECalculator(model64, skin=0.2).hydra.skin == 0.2
    calc = HydraCalculator(model64, skin=0.3)
    assert HydraASECalculator(calc).hydra.skin == 0.3  # a calculator passed in keeps its own
    assert HydraASECalculator(tiny_model(max_neighbours=4)).hydra.skin == 0.0  # reuse does not apply
    ts = pytest.importorskip("torch_sim")
    from hydragnn.infer import HydraTorchSimModel

    assert HydraTorchSimModel(model64).hydra.skin == MD_SKIN
    assert HydraTorchSimModel(model64, skin=0.0).hydra.skin == 0.0
    model = HydraTorchSimModel(HydraCalculator(model64, skin=0.4))
    assert model.hydra.skin == 0.4
    atoms = Atoms(numbers=[29, 29], positions=[[0, 0, 0], [1.8, 1.8, 0]], cell=np.eye(3) * 3.6, pbc=True)
    state = ts.io.atoms_to_state([atoms, atoms], torch.device("cpu"), torch.float64)
    model(state)
    model(state)
    assert model.hydra.neighbor_stats == {"builds": 1, "reuses": 1}
