"""Neighbor lists: nvalchemi-backed ``radius_graph`` against brute force and ASE's ``neighbor_list``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.neighborlist import neighbor_list as ase_neighbor_list
from torch_geometric.data import Batch, Data

import hydragnn.data.neighbors.search as nb
from hydragnn.data.errors import NeighborListError
from hydragnn.data.neighbors import add_edges, brute_force_radius_graph, radius_graph

F64 = torch.float64


@pytest.fixture(autouse=True)
def _nvalchemi_always(monkeypatch):
    """These tests check nvalchemi's candidates against the brute force and ASE, so small
    searches go to nvalchemi too (radius_graph would take the brute force below
    ``BRUTE_FORCE_MAX_PAIRS`` pairs or ``BRUTE_FORCE_MAX_ATOMS`` atoms per graph);
    ``test_small_searches_skip_nvalchemi`` and ``test_small_graphs_skip_nvalchemi`` check that path."""
    monkeypatch.setattr(nb, "BRUTE_FORCE_MAX_PAIRS", -1)
    monkeypatch.setattr(nb, "BRUTE_FORCE_MAX_ATOMS", 0)


def _triplets(edge_index, edge_shift, cell=None, batch=None):
    """Set of (source, target, integer image offset) of a radius graph."""
    src, dst = edge_index.tolist()
    if cell is None:
        ints = [(0, 0, 0)] * len(src)
    else:
        cells = cell.detach().to(F64).reshape(-1, 3, 3).clone()
        cells[torch.linalg.det(cells).abs() < 1e-9] = torch.eye(3, dtype=F64)  # zero shifts there
        per_edge = cells[0 if batch is None else batch[edge_index[1]]]
        s = torch.linalg.solve(per_edge.transpose(-1, -2), edge_shift.detach().to(F64).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(s, s.round(), atol=1e-4), "edge_shift is not an integer combination of cell rows"
        ints = [tuple(r) for r in s.round().long().tolist()]
    return set(zip(src, dst, ints, strict=True))


def _ase_triplets(pos, cutoff, cell=None, pbc=None, offset=0):
    atoms = Atoms(
        numbers=np.ones(len(pos), dtype=int),
        positions=pos.detach().to(F64).numpy(),
        cell=None if cell is None else cell.detach().to(F64).numpy(),
        pbc=False if cell is None else (True if pbc is None else pbc.tolist()),
    )
    i, j, s = ase_neighbor_list("ijS", atoms, cutoff)
    return {(int(b) + offset, int(a) + offset, tuple(int(v) for v in t)) for a, b, t in zip(i, j, s, strict=True)}


def _assert_same_as_brute_force(pos, cutoff, **kw):
    ei, es = radius_graph(pos, cutoff, **kw)
    ref_ei, ref_es = brute_force_radius_graph(pos, cutoff, **kw)
    assert ei.dtype == torch.int64 and es.dtype == pos.dtype
    assert torch.equal(ei, ref_ei)
    assert torch.equal(es, ref_es)
    if ei.shape[1]:  # sorted by (target, source)
        key = ei[1] * pos.shape[0] + ei[0]
        assert bool((key[1:] >= key[:-1]).all())
    return ei, es


def _edge_lengths(pos, ei, es):
    return (pos[ei[0]] - pos[ei[1]] + es).norm(dim=1)


@pytest.fixture(scope="module")
def cluster():
    g = torch.Generator().manual_seed(1)
    return torch.rand(40, 3, generator=g, dtype=F64) * 7.0


@pytest.fixture(scope="module")
def fcc():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=2)
    return torch.tensor(atoms.positions), torch.tensor(np.asarray(atoms.cell))


@pytest.fixture(scope="module")
def triclinic():
    g = torch.Generator().manual_seed(3)
    cell = torch.tensor([[4.0, 0.0, 0.0], [1.7, 3.9, 0.0], [-1.2, 0.9, 4.4]], dtype=F64)
    frac = torch.rand(12, 3, generator=g, dtype=F64) * 3.0 - 1.0  # unwrapped: up to a cell outside
    return frac @ cell, cell


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nonperiodic_cluster(cluster, dtype):
    pos = cluster.to(dtype)
    ei, es = _assert_same_as_brute_force(pos, 3.0)
    assert bool((es == 0).all())
    assert bool((_edge_lengths(pos, ei, es) < 3.0).all())
    if dtype == F64:
        assert _triplets(ei, es) == _ase_triplets(pos, 3.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_periodic_fcc(fcc, dtype):
    pos, cell = fcc[0].to(dtype), fcc[1].to(dtype)
    ei, es = _assert_same_as_brute_force(pos, 4.0, cell=cell)
    assert _triplets(ei, es, cell) == _ase_triplets(pos, 4.0, cell)
    assert ei.shape[1] == 32 * 18  # 12 first + 6 second neighbours (rattled far from 4.0)


def test_triclinic_unwrapped_positions(triclinic):
    pos, cell = triclinic
    ei, es = _assert_same_as_brute_force(pos, 3.5, cell=cell)
    assert _triplets(ei, es, cell) == _ase_triplets(pos, 3.5, cell)
    assert bool((_edge_lengths(pos, ei, es) < 3.5).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("cutoff", [2.0, 2.6, 5.5])  # > half, > one, > two cell lengths (shortest 2.4)
def test_small_cell_many_images(cutoff, dtype):
    cell = torch.tensor([[2.5, 0.0, 0.0], [0.8, 2.4, 0.0], [0.3, -0.5, 2.7]], dtype=dtype)
    pos = torch.tensor([[0.1, 0.2, 0.3], [1.3, 1.1, 1.6]], dtype=dtype)
    ei, es = _assert_same_as_brute_force(pos, cutoff, cell=cell)
    found = _triplets(ei, es, cell)
    assert found == _ase_triplets(pos, cutoff, cell)  # ASE in float64 on the same numbers
    pairs = Counter((i, j) for i, j, _ in found)
    assert max(pairs.values()) >= 2  # one pair through several images: minimum image would miss it
    assert any(i == j for i, j, _ in found) == (cutoff > 2.5)  # an atom's own images are edges
    assert not any(i == j and s == (0, 0, 0) for i, j, s in found)


@pytest.mark.parametrize("flags", [[True, True, False], [False, True, False], [False, False, False]])
def test_mixed_pbc(triclinic, flags):
    pos, cell = triclinic
    pbc = torch.tensor(flags)
    ei, es = _assert_same_as_brute_force(pos, 3.5, cell=cell, pbc=pbc)
    assert _triplets(ei, es, cell) == _ase_triplets(pos, 3.5, cell, pbc)


def test_degenerate_nonperiodic_cell_row():
    # 2D material stored with a zero c vector: only the periodic rows matter.
    pos = torch.tensor([[0.0, 0.0, 0.0], [1.2, 0.7, 0.4], [0.4, 1.9, -0.3]], dtype=F64)
    cell = torch.tensor([[2.5, 0.0, 0.0], [-1.25, 2.165, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    pbc = torch.tensor([True, True, False])
    ei, es = _assert_same_as_brute_force(pos, 4.0, cell=cell, pbc=pbc)
    full = cell.clone()
    full[2, 2] = 10.0
    assert _triplets(ei, es, full) == _ase_triplets(pos, 4.0, full, pbc)


@pytest.fixture(scope="module")
def mixed_batch(fcc, triclinic, cluster):
    """fcc (periodic), cluster (non-periodic), an empty graph, one atom in a small cell, triclinic slab."""
    one = torch.tensor([[0.4, 0.1, 0.2]], dtype=F64)
    small = torch.eye(3, dtype=F64) * 2.2
    parts = [
        (fcc[0], fcc[1], [True] * 3),
        (cluster[:15], torch.zeros(3, 3, dtype=F64), [False] * 3),
        (torch.zeros(0, 3, dtype=F64), torch.eye(3, dtype=F64), [True] * 3),
        (one, small, [True] * 3),
        (triclinic[0], triclinic[1], [True, False, True]),
    ]
    pos = torch.cat([p for p, _, _ in parts])
    batch = torch.cat([torch.full((len(p),), g) for g, (p, _, _) in enumerate(parts)])
    cell = torch.stack([c for _, c, _ in parts])
    pbc = torch.tensor([f for _, _, f in parts])
    return parts, pos, batch, cell, pbc


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_of_structures(mixed_batch, dtype):
    parts, pos, batch, cell, pbc = mixed_batch
    pos, cell = pos.to(dtype), cell.to(dtype)
    ei, es = _assert_same_as_brute_force(pos, 3.0, batch=batch, cell=cell, pbc=pbc)
    assert bool((batch[ei[0]] == batch[ei[1]]).all())
    if dtype == F64:
        expected, offset = set(), 0
        for p, c, f in parts:
            if len(p):
                expected |= _ase_triplets(p, 3.0, None if not any(f) else c, torch.tensor(f), offset)
            offset += len(p)
        assert _triplets(ei, es, cell, batch) == expected


def test_cell_list_method_agrees(mixed_batch, monkeypatch):
    _, pos, batch, cell, pbc = mixed_batch
    reference = radius_graph(pos, 3.0, batch=batch, cell=cell, pbc=pbc)
    monkeypatch.setattr(nb, "CELL_LIST_MIN_ATOMS", 1)
    ei, es = _assert_same_as_brute_force(pos, 3.0, batch=batch, cell=cell, pbc=pbc)
    assert torch.equal(ei, reference[0]) and torch.equal(es, reference[1])


def test_buffer_growth_drops_nothing(fcc, monkeypatch):
    pos, cell = fcc
    expected = brute_force_radius_graph(pos, 4.5, cell=cell)
    monkeypatch.setattr(nb, "_INITIAL_MAX_NEIGHBOURS", 2)
    ei, es = radius_graph(pos, 4.5, cell=cell)
    assert torch.equal(ei, expected[0]) and torch.equal(es, expected[1])  # no pair dropped
    assert ei.shape[1] > 2 * pos.shape[0]  # a 2-wide matrix could not have held them
    assert nb._last_attempts == 2  # it overflowed (silently) and was regrown once


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dense_cluster_in_a_large_cell_grows_the_buffer(dtype):
    """The width estimate from the mean density is far too small for a clustered structure."""
    g = torch.Generator().manual_seed(4)
    cell = torch.eye(3, dtype=F64) * 30.0
    cluster = torch.rand(60, 3, generator=g, dtype=F64) * 3.0 + 5.0  # 60 atoms in a 3 A cube
    lone = torch.tensor([[20.0, 20.0, 20.0], [29.5, 0.2, 15.0]], dtype=F64)
    pos = torch.cat([cluster, lone]).to(dtype)
    ei, es = _assert_same_as_brute_force(pos, 4.0, cell=cell.to(dtype))
    assert int(torch.bincount(ei[1]).max()) == 59  # every cluster atom sees the 59 others
    assert nb._last_attempts == 2  # found by growing, without any testing hook
    if dtype == F64:
        assert _triplets(ei, es, cell) == _ase_triplets(pos, 4.0, cell)


def test_float32_pairs_at_cutoff():
    # A rotated simple-cubic lattice far from the origin: in float32 the 6 first-neighbour
    # distances of every atom scatter by rounding around the exact lattice constant 2.5.
    atoms = bulk("Ni", "sc", a=2.5).repeat((3, 3, 3))
    atoms.rotate(30, "z", rotate_cell=True)
    atoms.rotate(20, "x", rotate_cell=True)
    pos = (torch.tensor(atoms.positions) + 1000.3).float()
    cell = torch.tensor(np.asarray(atoms.cell)).float()
    for c in (cell, None):
        ei, _ = _assert_same_as_brute_force(pos, 2.5, cell=c)
        first_shell = brute_force_radius_graph(pos, 2.6, cell=c)[0].shape[1]
        assert 0 < ei.shape[1] < first_shell  # really at the boundary: some pairs in, some out


def test_max_neighbours_keeps_k_nearest(cluster):
    k = 4
    ei, es = _assert_same_as_brute_force(cluster, 3.5, max_neighbours=k)
    full_ei, full_es = radius_graph(cluster, 3.5)
    kept, full = _edge_lengths(cluster, ei, es), _edge_lengths(cluster, full_ei, full_es)
    for i in range(cluster.shape[0]):
        mine, all_d = kept[ei[1] == i], full[full_ei[1] == i]
        assert mine.numel() == min(k, all_d.numel())
        assert torch.allclose(mine.sort().values, all_d.sort().values[:k])


def test_max_neighbours_ties_by_source_index():
    # atom 0 at the centre of six neighbours at exactly the same distance
    pos = torch.tensor([[0, 0, 0], [0, 0, -1], [1, 0, 0], [0, -1, 0], [-1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=F64)
    ei, _ = _assert_same_as_brute_force(pos, 1.5, max_neighbours=3)
    assert ei[0, ei[1] == 0].tolist() == [1, 2, 3]


def test_periodic_max_neighbours_and_self_loops(fcc):
    pos, cell = fcc
    ei, es = _assert_same_as_brute_force(pos, 4.0, cell=cell, max_neighbours=12, self_loops=True)
    assert torch.equal(torch.bincount(ei[1]), torch.full((32,), 13))
    loops = (ei[0] == ei[1]) & (es == 0).all(dim=1)
    assert int(loops.sum()) == 32


def test_gradients_match_finite_differences(triclinic):
    pos, cell = triclinic[0][:6].clone(), triclinic[1].clone()
    ei, _ = radius_graph(pos, 3.5, cell=cell)
    shift_int = _triplets(ei, radius_graph(pos, 3.5, cell=cell)[1], cell)
    assert len(shift_int) == ei.shape[1]

    def energy(p, c):
        edge_index, edge_shift = radius_graph(p, 3.5, cell=c)
        assert torch.equal(edge_index, ei)
        return _edge_lengths(p, edge_index, edge_shift).sum()

    p, c = pos.clone().requires_grad_(True), cell.clone().requires_grad_(True)
    grad_pos, grad_cell = torch.autograd.grad(energy(p, c), (p, c))
    h = 1e-6
    for i, d in [(0, 0), (2, 1), (5, 2)]:
        e = torch.zeros_like(pos)
        e[i, d] = h
        fd = (energy(pos + e, cell) - energy(pos - e, cell)) / (2 * h)
        assert float(grad_pos[i, d]) == pytest.approx(float(fd), abs=1e-6)
    e = torch.zeros_like(cell)
    e[1, 0] = h
    fd = (energy(pos, cell + e) - energy(pos, cell - e)) / (2 * h)
    assert float(grad_cell[1, 0]) == pytest.approx(float(fd), abs=1e-6)


def test_zero_and_one_atom():
    empty = torch.zeros(0, 3, dtype=F64)
    for kw in ({}, {"cell": torch.eye(3, dtype=F64) * 3.0}):
        ei, es = radius_graph(empty, 2.0, **kw)
        assert ei.shape == (2, 0) and es.shape == (0, 3)
    one = torch.tensor([[0.5, 0.5, 0.5]], dtype=F64)
    assert radius_graph(one, 2.0)[0].shape == (2, 0)
    assert radius_graph(one, 2.0, self_loops=True)[0].tolist() == [[0], [0]]
    ei, es = radius_graph(one, 2.0, cell=torch.eye(3, dtype=F64) * 1.5)
    assert ei.shape[1] == 6 and bool((es.norm(dim=1) == 1.5).all())


def test_add_edges_on_data_and_batch(fcc, cluster):
    periodic = Data(pos=fcc[0], cell=fcc[1].unsqueeze(0), pbc=torch.tensor([[True, True, True]]))
    molecule = Data(pos=cluster[:10], cell=torch.zeros(1, 3, 3, dtype=F64), pbc=torch.tensor([[False] * 3]))
    out = add_edges(periodic, 4.0)
    assert "edge_index" not in periodic and out.pos is periodic.pos
    expected = radius_graph(fcc[0], 4.0, cell=fcc[1])
    assert torch.equal(out.edge_index, expected[0]) and torch.equal(out.edge_shift, expected[1])

    batch = Batch.from_data_list([periodic, molecule])
    out = add_edges(batch, 4.0, max_neighbours=6)
    expected = radius_graph(batch.pos, 4.0, batch.batch, batch.cell, batch.pbc, max_neighbours=6)
    assert torch.equal(out.edge_index, expected[0]) and torch.equal(out.edge_shift, expected[1])
    assert out.num_graphs == 2

    plain = add_edges(Data(pos=cluster, edge_shift=torch.zeros(3, 3)), 3.0)
    assert "edge_shift" not in plain
    assert torch.equal(plain.edge_index, radius_graph(cluster, 3.0)[0])


_POS = torch.zeros(4, 3, dtype=F64)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pos": torch.zeros(4, 2)}, r"pos: expected shape \[N, 3\]"),
        ({"pos": torch.zeros(4, 3, dtype=torch.int64)}, "float32 or float64"),
        ({"pos": torch.tensor([[0.0, 0.0, float("nan")]])}, "NaN or inf in atom rows"),
        ({"pos": torch.tensor([[0.0, float("inf"), 0.0]])}, "NaN or inf"),
        ({"pos": torch.tensor([[0.0, 0.0, 0.0], [1e200, 0.0, 0.0]], dtype=F64)}, r"beyond 1e\+06 Å in atom rows \[1\]"),
        (
            {
                "pos": torch.tensor([[0.0, 0.0, 0.0], [1e300, 0.0, 0.0]], dtype=F64),
                "cell": 5.0 * torch.eye(3, dtype=F64),
            },
            "beyond",
        ),
        ({"cell": torch.eye(3, dtype=F64) * 1e200}, "cell: entries beyond"),
        ({"cutoff": 0.0}, "cutoff: expected a finite float > 0"),
        ({"cutoff": -1.0}, "cutoff"),
        ({"cutoff": float("nan")}, "cutoff"),
        ({"cell": torch.zeros(3, 3, dtype=F64)}, "singular cell"),
        ({"cell": torch.full((3, 3), float("nan"))}, "cell: expected finite entries"),
        ({"cell": torch.tensor([[1.0, 0, 0], [2.0, 0, 0], [0, 0, 1.0]])}, "singular cell"),
        ({"cell": torch.eye(3)[:2]}, r"cell: expected shape \[3, 3\] or \[B, 3, 3\]"),
        ({"cell": torch.eye(3), "pbc": torch.tensor([True, False])}, "pbc: expected shape"),
        ({"batch": torch.tensor([0, 1, 0, 1])}, "sorted graph indices"),
        ({"batch": torch.tensor([0, 0, 1])}, r"batch: expected shape \[4\]"),
        ({"batch": torch.tensor([0, 0, 1, 2]), "cell": torch.eye(3).expand(2, 3, 3)}, "some graphs only"),
        ({"pbc": torch.tensor([True, True, True])}, "no cell"),
        ({"max_neighbours": 0}, "max_neighbours"),
    ],
)
@pytest.mark.parametrize("fn", [radius_graph, brute_force_radius_graph])
def test_bad_inputs_raise(kwargs, match, fn):
    args = {"pos": _POS, "cutoff": 2.0} | kwargs
    with pytest.raises(NeighborListError, match=match):
        fn(**args)


def test_add_edges_without_pos():
    with pytest.raises(NeighborListError, match="'pos'"):
        add_edges(Data(x=torch.zeros(3, 1)), 2.0)


def test_add_edges_refuses_stale_derived_edge_tensors():
    from torch_geometric.data import Data

    data = Data(pos=torch.rand(4, 3), edge_index=torch.tensor([[0, 1], [1, 0]]), edge_attr=torch.ones(2, 1))
    with pytest.raises(NeighborListError, match=r"\['edge_attr'\].*Build edges before prepare"):
        nb.add_edges(data, 2.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("max_neighbours", [None, 5])
def test_add_edges_many_equals_one_by_one(mixed_batch, dtype, max_neighbours):
    """One search for many graphs (periodic, non-periodic without a cell, slab, empty, one atom)
    gives each graph exactly the edges, order and shifts of its own search."""
    parts, *_ = mixed_batch
    graphs = []
    for p, c, f in parts:
        g = Data(pos=p.to(dtype), x=torch.ones(len(p), 1))
        if any(f):
            g.cell, g.pbc = c.to(dtype).reshape(1, 3, 3), torch.tensor(f).reshape(1, 3)
        graphs.append(g)
    graphs.append(Data(pos=parts[1][0][:7].to(dtype) + 1.0))  # another molecule, no cell at all
    many = nb.add_edges_many(graphs, 3.0, max_neighbours)
    assert len(many) == len(graphs)
    for got, graph in zip(many, graphs):
        want = add_edges(graph, 3.0, max_neighbours)
        assert torch.equal(got.edge_index, want.edge_index)
        assert ("edge_shift" in got) == ("edge_shift" in want) == ("cell" in graph)
        if "edge_shift" in want:
            assert torch.equal(got.edge_shift, want.edge_shift)
        assert got.pos is graph.pos and "edge_index" not in graph  # shallow copies, inputs untouched


def test_add_edges_many_names_no_graph_but_fails_like_the_graph_at_fault():
    """A periodic cell too small for the cutoff among good graphs: the same error as that graph alone."""
    good = Data(pos=torch.rand(5, 3, dtype=F64) * 3)
    tiny = Data(pos=torch.zeros(1, 3, dtype=F64), cell=torch.eye(3, dtype=F64).reshape(1, 3, 3) * 0.01)
    with pytest.raises(ValueError) as alone:
        add_edges(tiny, 3.0)
    with pytest.raises(type(alone.value), match="cell"):
        nb.add_edges_many([good, tiny, good], 3.0)


def _counting_nvalchemi(monkeypatch) -> list:
    """Calls of nvalchemi's candidate search from now on (each appends one entry)."""
    calls: list = []
    real = nb._nvalchemi_candidates

    def counted(inputs):
        calls.append(inputs)
        return real(inputs)

    monkeypatch.setattr(nb, "_nvalchemi_candidates", counted)
    return calls


@pytest.mark.parametrize("case", ["molecules", "cell"])
def test_small_searches_skip_nvalchemi(monkeypatch, case):
    """At or below BRUTE_FORCE_MAX_PAIRS the candidates come from the brute force (no Warp call)
    and the edges equal nvalchemi's; one pair more and nvalchemi runs."""
    from hydragnn.data.neighbors.brute_force import brute_force_pairs
    from hydragnn.data.neighbors.inputs import check_inputs

    if case == "molecules":
        water = [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]]
        methane = [[0, 0, 0], [0.63, 0.63, 0.63], [-0.63, -0.63, 0.63], [-0.63, 0.63, -0.63], [0.63, -0.63, -0.63]]
        pos, batch, cell = torch.tensor(water + methane, dtype=F64), torch.tensor([0] * 3 + [1] * 5), None
    else:
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
        pos, batch, cell = torch.tensor(atoms.positions), None, torch.tensor(atoms.cell.array)
    calls = _counting_nvalchemi(monkeypatch)
    expected = radius_graph(pos, 5.0, batch, cell)  # BRUTE_FORCE_MAX_PAIRS -1 (the fixture): nvalchemi
    assert len(calls) == 1
    pairs = brute_force_pairs(check_inputs(pos, 5.0, batch, cell, None))
    assert 0 < pairs <= 1 << 20
    monkeypatch.setattr(nb, "BRUTE_FORCE_MAX_PAIRS", pairs)
    found = radius_graph(pos, 5.0, batch, cell)
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    monkeypatch.setattr(nb, "BRUTE_FORCE_MAX_PAIRS", pairs - 1)
    found = radius_graph(pos, 5.0, batch, cell)
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_small_graphs_skip_nvalchemi(monkeypatch, dtype):
    """On CPU a batch of graphs under BRUTE_FORCE_MAX_ATOMS atoms is searched in torch however many
    pairs it has (the fixture puts BRUTE_FORCE_MAX_PAIRS below any search; cells and slabs of 32 and
    48 atoms, molecules), with nvalchemi's edges; a graph at the bound sends the batch to nvalchemi."""
    rng = np.random.default_rng(3)
    structures = []
    for k in range(24):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2 + k % 2))
        atoms.rattle(0.1, seed=k)
        structures.append((atoms.positions, atoms.cell.array, [True, True, k % 3 != 0]))
    for k in range(8):  # molecules far from the origin: the product of large coordinates stays exact enough
        structures.append((rng.normal(size=(5 + k, 3)) + 1e3, np.zeros((3, 3)), [False] * 3))
    pos = torch.tensor(np.concatenate([s[0] for s in structures]), dtype=dtype)
    counts = torch.tensor([len(s[0]) for s in structures])
    batch = torch.repeat_interleave(torch.arange(len(structures)), counts)
    cell = torch.tensor(np.stack([s[1] for s in structures]), dtype=dtype)
    pbc = torch.tensor([s[2] for s in structures])
    calls = _counting_nvalchemi(monkeypatch)
    expected = radius_graph(pos, 4.0, batch, cell, pbc)  # the fixture: nvalchemi
    assert len(calls) == 1
    monkeypatch.setattr(nb, "BRUTE_FORCE_MAX_ATOMS", int(counts.max()) + 1)
    found = radius_graph(pos, 4.0, batch, cell, pbc)
    assert len(calls) == 1, "a batch of small graphs went to nvalchemi"
    assert expected[0].shape[1] > 10_000
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    monkeypatch.setattr(nb, "BRUTE_FORCE_MAX_ATOMS", int(counts.max()))
    found = radius_graph(pos, 4.0, batch, cell, pbc)
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_brute_force_candidates_shortcuts_change_no_edge(mixed_batch, fcc, dtype):
    """The brute force hands finalize_edges its Cartesian offsets and, for one group of equal
    graphs, candidates already in edge order: the edges, shifts and lengths are those of the same
    candidates without either shortcut, shuffled, bit for bit."""
    from hydragnn.data.neighbors.brute_force import Candidates, brute_force_candidates, finalize_edges
    from hydragnn.data.neighbors.inputs import check_inputs

    _, pos, batch, cell, pbc = mixed_batch
    four = torch.cat([fcc[0] + 0.01 * k for k in range(4)])  # four equal cells: one group, ordered
    cases = [
        (pos, batch, cell, pbc),
        (four, torch.arange(4).repeat_interleave(len(fcc[0])), fcc[1].expand(4, 3, 3), None),
    ]
    for p, b, c, f in cases:
        inputs = check_inputs(p.to(dtype), 3.0, b, c.to(dtype), f)
        found = brute_force_candidates(inputs)
        assert found.parts is not None and found.ordered == (p is four)
        shuffle = torch.randperm(found.src.numel(), generator=torch.Generator().manual_seed(0))
        plain = Candidates(found.src[shuffle], found.dst[shuffle], found.shift_int[shuffle])
        for k in (None, 4):
            a, e = finalize_edges(inputs, found, k, False), finalize_edges(inputs, plain, k, False)
            assert all(torch.equal(x, y) for x, y in zip(a, e)), k
            assert a.length2.dtype == dtype and bool((a.length2 < 9.0).all())
