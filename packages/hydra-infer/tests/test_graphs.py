"""CUDA-graph engine policy on CPU through the replay backend (the same static-buffer code path).

Every test drives the public ``calc(...)`` call of a calculator built by the ``graph_calc``
fixture (conftest.py: the testing-only backend installed) and reads the engine's event counters
from ``calc.memory_stats()``.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from infer_helpers import cluster, tiny_model

from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.infer import HydraCalculator, HydraInferWarning
from hydragnn.infer.graphs import MAX_ENGINES, GraphEngineCache, ReplayBackend

POS, Z = cluster(6)


def stats(calc) -> dict[str, int]:
    return calc.memory_stats()


def dense_batch(sizes, width=None, seed=0):
    width = width or max(sizes)
    coord = np.full((len(sizes), width, 3), np.nan)  # padding may be anything, even NaN
    numbers = np.zeros((len(sizes), width), dtype=int)
    for b, n in enumerate(sizes):
        p, z = cluster(n, seed=seed + b)
        coord[b, :n], numbers[b, :n] = p, z
    return coord, numbers


def assert_same(got, want):
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-10)


def test_first_regular_second_captured_third_replayed(model64, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eligible call on the replay backend warns about nothing
        first = calc(POS, Z, forces=True)
        assert stats(calc)["first_sightings"] == 1 and stats(calc)["captures"] == 0
        second = calc(POS, Z, forces=True)
        assert stats(calc)["captures"] == 1 and stats(calc)["admitted"] == 1 and stats(calc)["replays"] == 0
        moved = POS + 0.05
        third = calc(moved, Z, forces=True)
    s = stats(calc)
    assert s["replays"] == 1 and s["engines"] == 1 and s["graphs"] == 1
    want = ref(POS, Z, forces=True)
    assert_same(first, want)
    assert_same(second, want)
    assert_same(third, ref(moved, Z, forces=True))


def test_the_replay_backend_is_an_argument(model64):
    """The CPU replay backend is passed in (no environment variable, no module global)."""
    calc = HydraCalculator(model64, cuda_graph=True, graph_backend="replay")
    assert isinstance(calc.graph_engine, GraphEngineCache) and isinstance(calc.graph_engine.backend, ReplayBackend)
    assert HydraCalculator(model64).graph_engine is None  # cuda_graph off
    assert HydraCalculator(model64, cuda_graph=True).graph_engine is None  # CPU without a backend: no engine


def test_rejected_graph_keeps_layout_on_regular_path(model64, graph_calc):
    def perturb(outputs):
        outputs["energy"] += 1e-3

    calc, ref = graph_calc(model64, ReplayBackend(perturb=perturb)), HydraCalculator(model64)
    calc(POS, Z, forces=True)
    with pytest.warns(HydraInferWarning, match="did not match the regular path"):
        out = calc(POS, Z, forces=True)
    assert_same(out, ref(POS, Z, forces=True))  # the regular result answered
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert_same(calc(POS, Z, forces=True), ref(POS, Z, forces=True))
    s = stats(calc)
    assert s["rejected"] == 1 and s["captures"] == 1 and s["replays"] == 0 and s["engines"] == 0
    # other layouts are still captured
    pos, z = cluster(5, seed=2)
    calc(pos, z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reason was warned about once already
        calc(pos, z)
    assert stats(calc)["rejected"] == 2


def test_force_perturbation_within_noise_is_admitted(model64, graph_calc):
    def perturb(outputs):
        outputs["forces"] += 1e-6  # well inside 1e-4 eV/Å

    calc = graph_calc(model64, ReplayBackend(perturb=perturb))
    for _ in range(3):
        calc(POS, Z, forces=True)
    assert stats(calc)["admitted"] == 1 and stats(calc)["replays"] == 1


def test_keys_are_rows_atoms_and_force_request(model64, graph_calc):
    calc = graph_calc(model64)
    for _ in range(2):
        calc(POS, Z, forces=True)
        calc(POS, Z, forces=False)  # another key
        calc(POS[:5], Z[:5], forces=True)  # another N
    assert stats(calc)["engines"] == 3
    keys = set(calc.graph_engine.engines)
    assert keys == {("dense", 1, 6, True), ("dense", 1, 6, False), ("dense", 1, 5, True)}
    energy_only = calc(POS, Z)
    assert "forces" not in energy_only and stats(calc)["replays"] == 1


def test_smaller_batch_reuses_larger_graph_within_a_third(model64, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    big = dense_batch([4, 7, 5, 6, 3, 7], width=7)  # B = 6
    calc(*big, forces=True)
    calc(*big, forces=True)
    assert stats(calc)["engines"] == 1
    five = dense_batch([4, 7, 5, 6, 2], width=7, seed=10)  # 1 extra row <= max(1, 5 // 3)
    out = calc(*five, forces=True)  # the first reuse for 5 rows is checked against the regular path
    assert stats(calc)["padded_checks"] == 1 and stats(calc)["replays"] == 0
    assert_same(out, ref(*five, forces=True))
    five = dense_batch([4, 7, 5, 6, 2], width=7, seed=11)
    out = calc(*five, forces=True)
    assert stats(calc)["padded_replays"] == 1 and stats(calc)["replays"] == 1 and stats(calc)["padded_checks"] == 1
    assert_same(out, ref(*five, forces=True))
    assert out["energy"].shape == (5,) and out["forces"].shape == (5, 7, 3)
    four = dense_batch([4, 7, 5, 6], width=7, seed=20)  # 2 extra rows > max(1, 4 // 3) = 1
    calc(*four, forces=True)
    assert stats(calc)["replays"] == 1 and stats(calc)["first_sightings"] == 2
    three = dense_batch([4, 7, 5], width=7, seed=30)
    calc(*three, forces=True)  # 3 extra rows: no reuse either
    assert stats(calc)["replays"] == 1


def test_smallest_recorded_graph_is_reused(model64, graph_calc):
    calc = graph_calc(model64)
    for sizes in ([3, 4, 5, 6, 7, 7, 7], [3, 4, 5, 6, 7, 7, 7, 7]):  # B = 7, then B = 8 (7 cannot serve 8)
        for _ in range(2):
            calc(*dense_batch(sizes, width=7))
    for _ in range(2):
        calc(*dense_batch([3, 4, 5, 6, 7, 7], width=7))  # B = 6: 7 and 8 both allowed (slack 2)
    engines = calc.graph_engine.engines
    assert len(engines) == 2 and stats(calc)["padded_checks"] == 1 and stats(calc)["padded_replays"] == 1
    assert list(engines)[-1] == ("dense", 7, 7, False)  # the smaller one was used (most recent)


def test_lru_evicts_the_oldest_of_17_layouts(model64, graph_calc):
    calc = graph_calc(model64)
    sizes = list(range(2, 2 + MAX_ENGINES + 1))  # 17 atom counts
    for n in sizes:
        pos, z = cluster(n, seed=n)
        calc(pos, z)
        calc(pos, z)
    s = stats(calc)
    assert s["admitted"] == 17 and s["engines"] == 16 and s["evictions"] == 1
    assert ("dense", 1, 2, False) not in calc.graph_engine.engines
    pos, z = cluster(3, seed=3)
    calc(pos, z)  # still cached: replay, and now the most recent
    assert stats(calc)["replays"] == 1 and list(calc.graph_engine.engines)[-1] == ("dense", 1, 3, False)


def test_budget_rejects_an_engine_that_does_not_fit(model64, graph_calc):
    calc = graph_calc(model64, ReplayBackend(total_memory=1000))  # budget 250 bytes
    calc(POS, Z, forces=True)
    with pytest.warns(HydraInferWarning, match="does not fit the budget"):
        calc(POS, Z, forces=True)
    s = stats(calc)
    assert s["budget_rejected"] == 1 and s["engines"] == 0 and s["budget_bytes"] == 250
    calc(POS, Z, forces=True)
    assert stats(calc)["captures"] == 1  # never recaptured


def test_over_budget_capture_rejects_that_layout_and_evicts_nothing(model64, graph_calc):
    probe = graph_calc(model64)
    probe(POS, Z)
    probe(POS, Z)
    size = probe.memory_stats()["graph_pool_bytes"] + probe.memory_stats()["static_buffer_bytes"]
    calc = graph_calc(model64, ReplayBackend(total_memory=4 * int(size * 1.5)))  # room for one such engine
    for pos, z in ((POS, Z), (POS[:5], Z[:5])):
        calc(pos, z)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            calc(pos, z)
    assert any("does not fit the budget" in str(w.message) for w in record)
    s = stats(calc)
    assert s["admitted"] == 1 and s["budget_rejected"] == 1 and s["evictions"] == 0
    assert list(calc.graph_engine.engines) == [("dense", 1, 6, False)]  # the admitted engine stays
    assert s["retirements"] == 0  # what remains fits: the generation is kept
    calc(POS, Z)
    assert stats(calc)["replays"] == 1


def test_memory_stats_and_clear(model64, graph_calc):
    calc = graph_calc(model64)
    assert stats(calc)["graph_pool_bytes"] == 0 and stats(calc)["static_buffer_bytes"] == 0
    calc(POS, Z, forces=True)
    calc(POS, Z, forces=True)
    s = stats(calc)
    assert s["graph_pool_bytes"] > 0 and s["static_buffer_bytes"] > 0 and s["budget_bytes"] > 0
    calc.clear_cuda_graphs()
    s = stats(calc)
    assert s["engines"] == s["graphs"] == s["graph_pool_bytes"] == s["static_buffer_bytes"] == 0
    calc(POS, Z, forces=True)  # history was released too: a first sighting again
    assert stats(calc)["first_sightings"] == 2


@pytest.mark.parametrize("change", ["load_state_dict", "in_place"])
def test_model_change_invalidates_engines(change, graph_calc):
    model = tiny_model(seed=0)
    calc = graph_calc(model)
    for _ in range(3):
        calc(POS, Z, forces=True)
    assert stats(calc)["replays"] == 1
    with torch.no_grad():
        if change == "load_state_dict":
            model.load_state_dict(tiny_model(seed=5).state_dict())
        else:
            for p in model.parameters():
                p.mul_(1.1)
    out = calc(POS, Z, forces=True)
    s = stats(calc)
    assert s["invalidations"] == 1 and s["engines"] == 0 and s["replays"] == 1
    assert_same(out, HydraCalculator(model)(POS, Z, forces=True))
    calc(POS, Z, forces=True)
    replayed = calc(POS + 0.01, Z, forces=True)
    assert stats(calc)["replays"] == 2
    assert_same(replayed, HydraCalculator(model)(POS + 0.01, Z, forces=True))  # the new weights


def test_sparse_engine_capacity_overflow_rebuild(graph_calc):
    model = tiny_model()
    calc, ref = graph_calc(model, nb_threshold=8), HydraCalculator(model)
    pos, z = cluster(16, seed=4)
    calc(pos, z, forces=True)
    calc(pos, z, forces=True)
    engine = next(iter(calc.graph_engine.engines.values()))
    assert engine.kind == "sparse"
    edges = engine.edge_count(calc._check(pos, z, None, None, None, None))
    assert engine.capacity > edges
    # slightly compressed: more edges, still within the spare capacity -> same engine
    squeezed = pos * 0.97
    more = engine.edge_count(calc._check(squeezed, z, None, None, None, None))
    assert edges < more <= engine.capacity
    assert_same(calc(squeezed, z, forces=True), ref(squeezed, z, forces=True))
    assert stats(calc)["replays"] == 1 and stats(calc)["overflows"] == 0
    # strongly compressed: overflow detected after the replay -> rebuild -> re-validate
    crushed = pos * 0.6
    out = calc(crushed, z, forces=True)
    s = stats(calc)
    assert s["overflows"] == 1 and s["rebuilds"] == 1 and s["captures"] == 2 and s["admitted"] == 2
    assert_same(out, ref(crushed, z, forces=True))
    new = calc.graph_engine.engines[engine.key]
    assert new is not engine and new.capacity > engine.capacity
    assert_same(calc(crushed + 0.01, z, forces=True), ref(crushed + 0.01, z, forces=True))
    assert stats(calc)["replays"] == 2


def test_sparse_flat_batch(model64, graph_calc):
    calc, ref = graph_calc(model64), HydraCalculator(model64)
    (p1, z1), (p2, z2) = cluster(5, seed=1), cluster(7, seed=2)
    pos, z = np.concatenate([p1, p2 + 1.0]), np.concatenate([z1, z2])  # overlapping in space
    mol = np.repeat([0, 1], [5, 7])
    for _ in range(3):
        out = calc(pos, z, mol_idx=mol, forces=True)
    assert stats(calc)["replays"] == 1 and next(iter(calc.graph_engine.engines))[0] == "sparse"
    assert_same(out, ref(pos, z, mol_idx=mol, forces=True))


def test_ineligible_calls_fall_back_with_one_warning_each(model64, cuau_atoms, graph_calc):
    calc = graph_calc(model64)
    a = cuau_atoms[0]
    with pytest.warns(HydraInferWarning, match="a cell with non-periodic directions"):
        calc(a.positions, a.numbers, cell=a.cell.array, pbc=[True, False, True])
    with pytest.warns(HydraInferWarning) as record:
        calc(a.positions, a.numbers, cell=a.cell.array, pbc=[True, False, True], stress=True)
    assert [str(w.message) for w in record if "stress was requested" in str(w.message)]
    with pytest.warns(HydraInferWarning, match="require grad"):
        calc(torch.tensor(POS, requires_grad=True), Z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calc(a.positions, a.numbers, cell=a.cell.array, pbc=[True, False, True], stress=True)
        calc(torch.tensor(POS, requires_grad=True), Z)
    assert stats(calc)["first_sightings"] == 0  # the engine never saw them
    assert {code for _, code in calc._warnings.issued} == {"cell", "stress", "requires_grad"}


def test_outputs_are_copies(model64, graph_calc):
    calc = graph_calc(model64)
    for _ in range(2):
        calc(POS, Z, forces=True)
    a = calc(POS, Z, forces=True)
    keep = {k: v.clone() for k, v in a.items()}
    for v in a.values():
        v.add_(100.0)
    b = calc(POS, Z, forces=True)
    assert stats(calc)["replays"] == 2
    assert_same(b, keep)
    assert all(a[k].data_ptr() != b[k].data_ptr() for k in a)


def test_compile_with_graph_warns_once_and_replays_eager(model64, graph_calc):
    with pytest.warns(HydraInferWarning, match="eligible calls run the eager model"):
        calc = graph_calc(model64, compile_model=True, compile_options={"backend": "eager"})  # at construction
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="Guards may run slower on Python 3.13.0")  # torch's, on 3.13.0 only
        calc(POS, Z, forces=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calc(POS, Z, forces=True)
        out = calc(POS, Z, forces=True)
    assert stats(calc)["replays"] == 1
    engine = next(iter(calc.graph_engine.engines.values()))
    assert engine.model is calc.eager_model and calc.runner.regular_runner.name == "compiled"
    assert_same(out, HydraCalculator(model64)(POS, Z, forces=True))


def test_unsupported_models_get_no_engine(graph_calc):
    calc = graph_calc(tiny_model(max_neighbours=4))
    assert calc.graph_engine is None
    with pytest.warns(HydraInferWarning) as record:
        calc(POS, Z)
    assert any("max_neighbours caps" in str(w.message) for w in record)


def test_charge_model(graph_calc):
    variables = copy.deepcopy(CUAU_VARIABLES)
    variables["inputs"].append({"name": "charge", "level": "graph", "dim": 1})
    try:
        model = tiny_model(variables=variables)
    except Exception as exc:  # pragma: no cover - a schema the model zoo does not take
        pytest.skip(f"no charge model: {exc}")
    calc, ref = graph_calc(model), HydraCalculator(model)
    for q in (0.0, 1.0, -1.0):
        out = calc(POS, Z, charge=q, forces=True)
    assert stats(calc)["replays"] == 1
    assert_same(out, ref(POS, Z, charge=-1.0, forces=True))


def test_sparse_engine_too_large_for_budget_is_never_allocated(model64, graph_calc):
    calc = graph_calc(model64, ReplayBackend(total_memory=4 * 2**20), nb_threshold=8)  # budget 1 MiB
    pos, z = cluster(200, seed=1)  # 200 * 199 pairs * 64 B > 1 MiB
    calc(pos, z)
    with pytest.warns(HydraInferWarning, match="does not fit the budget"):
        calc(pos, z)
    s = stats(calc)
    assert s["budget_rejected"] == 1 and s["captures"] == 0


def test_float32_model_dense_and_sparse(graph_calc):
    model = tiny_model(precision="fp32")
    ref = HydraCalculator(model)
    for threshold in (120, 4):  # dense, then sparse
        calc = graph_calc(model, nb_threshold=threshold)
        for shift in (0.0, 0.0, 0.02):
            out = calc(POS + shift, Z, forces=True)
        assert stats(calc)["replays"] == 1
        want = ref(POS + 0.02, Z, forces=True)
        torch.testing.assert_close(out["forces"], want["forces"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out["energy"], want["energy"], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("kind", ["dense", "sparse", "periodic cell list"])
def test_static_forward_runs_on_meta_tensors(model64, kind):
    """A proxy of capture safety on CPU: meta tensors have no values, so any host sync
    (``.item()``, data-dependent shapes) in the captured callable would raise."""
    from hydragnn.infer.graphs.dense import DenseEngine
    from hydragnn.infer.graphs.sparse import SparseEngine

    calc = HydraCalculator(model64)
    if kind == "dense":
        engine = DenseEngine(calc, 3, 7, True)
    else:
        (p1, z1), (p2, z2) = cluster(5, seed=1), cluster(7, seed=2)
        call = calc._check(
            np.concatenate([p1, p2]), np.concatenate([z1, z2]), None, None, None, np.repeat([0, 1], [5, 7])
        )
        engine = SparseEngine(calc, 12, 2, True, capacity=40, grid=SparseEngine.plan(calc, call))
    if kind == "periodic cell list":
        from ase.build import bulk

        from hydragnn.infer.graphs.periodic import PeriodicEngine, plan

        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((4, 4, 4))
        call = calc._check(atoms.positions, atoms.numbers, None, atoms.cell.array, None, None)
        engine = PeriodicEngine(calc, (256,), True, call, 4000, plan(calc, call))
        assert engine.grid is not None
    engine.model = copy.deepcopy(model64).to("meta")
    engine.buffers = {k: v.to("meta") for k, v in engine.buffers.items()}
    engine.device = torch.device("meta")
    out = engine.fn()
    nodes = {"dense": 22, "sparse": 13, "periodic cell list": 257}[kind]
    assert out["forces"].shape == (nodes, 3) and out["forces"].device.type == "meta"


def test_padded_batch_above_nb_threshold_uses_the_sparse_engine(model64, graph_calc):
    """An extension of the reference policy (documented in the README): padded ``[B, N, 3]``
    batches with ``N > nb_threshold`` replay the sparse engine on their real atoms."""
    calc, ref = graph_calc(model64, nb_threshold=4), HydraCalculator(model64)
    for seed in (0, 0, 3):
        batch = dense_batch([5, 7, 6], width=7, seed=seed)
        out = calc(*batch, forces=True)
    assert_same(out, ref(*batch, forces=True))
    assert stats(calc)["replays"] == 1 and list(calc.graph_engine.engines) == [("sparse", 18, 3, True)]
