"""hydra-infer serves the global-attention MLIPs of hydra-models: GPS (multihead and performer)
and the equivariant transformer (alone and after a local encoder).

Each variant is saved as an artifact and served from it; the calculator must equal the model
on periodic cells (energy, forces, stress) and on batches of clusters, and the CUDA-graph
engines (run on CPU through the replay backend: the same static buffers, sink padding and
capture-safe forward) must equal the regular path.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from infer_helpers import cluster, tiny_model

from hydragnn.infer import HydraCalculator, HydraInferWarning
from hydragnn.infer.kernels import install
from hydragnn.models import save_artifact

VARIANTS: dict[str, dict] = {
    "SchNet+GPS-multihead": {"global_attn_engine": "GPS"},
    "PAINN+GPS-performer": {
        "mpnn_type": "PAINN",
        "global_attn_engine": "GPS",
        "global_attn_type": "performer",
        "global_attn_features": 16,
    },
    "EquivariantTransformer": {"mpnn_type": None, "global_attn_engine": "EquivariantTransformer"},
    "SchNet+EquivariantTransformer": {"global_attn_engine": "EquivariantTransformer"},
}


def assert_same(got, want, rtol=1e-9, atol=1e-10):
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=rtol, atol=atol)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def served(request, tmp_path_factory):
    """(variant name, model, calculator loaded from the model's artifact)."""
    model = tiny_model(seed=3, **VARIANTS[request.param])
    path = save_artifact(model, tmp_path_factory.mktemp("artifacts") / "model.hydra", species=[29, 79])
    return request.param, model, HydraCalculator(path)


def test_artifact_calculator_equals_model(served, cuau_atoms):
    name, model, calc = served
    direct = HydraCalculator(model)
    for atoms in cuau_atoms[:2]:
        args = (atoms.positions, atoms.numbers)
        got = calc(*args, cell=atoms.cell.array, forces=True, stress=True)
        assert_same(got, direct(*args, cell=atoms.cell.array, forces=True, stress=True))
        assert torch.isfinite(got["stress"]).all() and got["forces"].abs().sum() > 0, name
    # a batch of clusters equals the clusters one by one (attention never crosses structures)
    (p1, z1), (p2, z2) = cluster(5, seed=1), cluster(7, seed=2)
    pos, z = np.concatenate([p1, p2 + 1.0]), np.concatenate([z1, z2])  # overlapping in space
    both = calc(pos, z, mol_idx=np.repeat([0, 1], [5, 7]), forces=True)
    one, two = calc(p1, z1, forces=True), calc(p2 + 1.0, z2, forces=True)
    torch.testing.assert_close(both["energy"], torch.cat([one["energy"], two["energy"]]), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(both["forces"], torch.cat([one["forces"], two["forces"]]), rtol=1e-9, atol=1e-10)


def test_graph_engines_replay_the_regular_path(served):
    """Dense (one cluster) and sparse (flat batch) engines: capture, then replay on new positions."""
    name, model, _ = served
    calc = HydraCalculator(model, cuda_graph=True, graph_backend="replay")
    ref = HydraCalculator(model)
    pos, z = cluster(6, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eligible: no fallback warning
        for step in range(3):
            moved = pos + 0.02 * step
            assert_same(calc(moved, z, forces=True), ref(moved, z, forces=True))
    (p1, z1), (p2, z2) = cluster(5, seed=1), cluster(7, seed=2)
    flat, zz, mol = np.concatenate([p1, p2]), np.concatenate([z1, z2]), np.repeat([0, 1], [5, 7])
    for _ in range(3):
        out = calc(flat, zz, mol_idx=mol, forces=True)
    assert_same(out, ref(flat, zz, mol_idx=mol, forces=True))
    stats = calc.memory_stats()
    assert stats["replays"] >= 2 and stats["engines"] == 2, (name, stats)


def test_periodic_engine_replays_the_regular_path(served, cuau_atoms):
    """The periodic engine (in-graph neighbour list, cell as input) for every served variant."""
    name, model, _ = served
    calc = HydraCalculator(model, cuda_graph=True, graph_backend="replay")
    ref = HydraCalculator(model)
    atoms = cuau_atoms[3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(3):
            moved, cell = atoms.positions + 0.02 * step, atoms.cell.array * (1 + 0.005 * step)
            assert_same(
                calc(moved, atoms.numbers, cell=cell, forces=True), ref(moved, atoms.numbers, cell=cell, forces=True)
            )
    assert calc.memory_stats()["replays"] == 1, name


def test_inference_kernels_cover_gps_models():
    """The kernels replace primitives, not encoders: a SchNet+GPS model gets them around its mixers."""
    from hydragnn.models.nn import Primitive

    model = tiny_model(**VARIANTS["SchNet+GPS-multihead"])
    patched, why = install(model)
    assert why is None and patched is not model
    on_triton = {type(m).__name__ for m in patched.modules() if isinstance(m, Primitive) and m.backend == "triton"}
    assert on_triton == {"RadialFilter", "ContinuousFilterConv"}
    assert patched.encoder.mixers is not None


def test_positional_encodings_are_computed_per_structure(cuau_atoms):
    """A GPS model with pe_dim: the calculator computes lap_pe / rw_pe per structure exactly as
    hydra-data prepares them, batched or not; CUDA graphs are refused with the reason."""
    from torch_geometric.data import Batch

    from hydragnn.data import Schema, add_edges, prepare
    from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau
    from hydragnn.data.positional import add_positional_encodings

    model = tiny_model(seed=5, global_attn_engine="GPS", pe_dim=3)
    calc = HydraCalculator(model)
    schema = Schema.from_dict(CUAU_VARIABLES)
    samples = [
        add_positional_encodings(add_edges(prepare(s, schema, index=i), model.cutoff), 3)
        for i, s in enumerate(generate_cuau(2, seed=7))
    ]
    batch = Batch.from_data_list(samples)
    batch.pos = batch.pos.double()
    batch.cell, batch.edge_shift = batch.cell.double(), batch.edge_shift.double()
    want = model(batch)
    coord = np.stack([s.pos.numpy() for s in samples])
    numbers = np.stack([s.atomic_number.reshape(-1).numpy() for s in samples])
    cells = np.stack([s.cell.reshape(3, 3).numpy() for s in samples])
    got = calc(coord, numbers, cell=cells, forces=True)
    torch.testing.assert_close(got["energy"], want["energy"].reshape(-1), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got["forces"].reshape(-1, 3), want["forces"], rtol=1e-8, atol=1e-9)
    graphs = HydraCalculator(model, cuda_graph=True, graph_backend="replay")
    with pytest.warns(HydraInferWarning, match="positional encodings"):
        graphs(coord[0], numbers[0], cell=cells[0])


@pytest.mark.parametrize(
    "overrides",
    [
        {"mpnn_type": "UMA", "hidden_dim": 8, "lmax": 1, "mmax": 1},
        {"mpnn_type": "AllScAIP", "hidden_dim": 8},
    ],
    ids=["UMA", "AllScAIP"],
)
def test_fairchem_encoders_are_served(overrides, tmp_path, cuau_atoms):
    """UMA and AllScAIP MLIPs (extra hydra-models[fairchem]) from an artifact: the calculator
    equals the model on a periodic cell, and graph replay equals the regular path."""
    pytest.importorskip("fairchem.core", reason="needs hydra-models[fairchem]")
    model = tiny_model(seed=2, **overrides)
    calc = HydraCalculator(save_artifact(model, tmp_path / "model.hydra", species=[29, 79]))
    atoms = cuau_atoms[0]
    args = (atoms.positions, atoms.numbers)
    got = calc(*args, cell=atoms.cell.array, forces=True, stress=True)
    assert_same(got, HydraCalculator(model)(*args, cell=atoms.cell.array, forces=True, stress=True))
    graphs = HydraCalculator(model, cuda_graph=True, graph_backend="replay")
    pos, z = cluster(6, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(3):
            moved = pos + 0.02 * step
            assert_same(graphs(moved, z, forces=True), calc(moved, z, forces=True), rtol=1e-6, atol=1e-7)
    assert graphs.memory_stats()["replays"] == 1


def test_uma_with_experts_is_served_without_capture():
    pytest.importorskip("fairchem.core", reason="needs hydra-models[fairchem]")
    model = tiny_model(mpnn_type="UMA", hidden_dim=8, lmax=1, mmax=1, num_experts=2)
    calc = HydraCalculator(model, cuda_graph=True, graph_backend="replay")
    pos, z = cluster(5)
    with pytest.warns(HydraInferWarning, match="not capture-safe"):
        out = calc(pos, z, forces=True)
    assert_same(out, HydraCalculator(model)(pos, z, forces=True))
