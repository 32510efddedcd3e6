"""Graph-level conditioning (``use_graph_attr_conditioning``): every mode uses the graph inputs,
keeps rotation invariance / equivariance, batch == single, padded == unpadded, capture safety,
artifact round trip, and the config errors."""

from __future__ import annotations

import pytest
import torch

from hydragnn.data import Schema, prepare
from hydragnn.models import ModelConfig, ModelConfigError, build_model, load_artifact, pad_with_sink, save_artifact
from hydragnn.models.conditioning import NodeConditioning
from hydragnn.models.testing import CUTOFF, HostSyncDetector, register_variant, small_arch
from hydragnn.models.testing.graphs import _label, collate, periodic_atoms, random_rotation, with_edges

COND_SCHEMA = Schema.from_dict(
    {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            {"name": "total_charge", "level": "graph", "dim": 1},
            {"name": "spin", "level": "graph", "dim": 1},
        ],
        "outputs": [
            {"name": "energy", "level": "graph", "dim": 1},
            {"name": "gap", "level": "graph", "dim": 2},
            {"name": "forces", "level": "node", "dim": 3},
        ],
    }
)
"""An MLIP with two graph inputs (charge, spin) and an extra graph output (``gap``)."""
MODES = ("concat_node", "film", "fuse_pool")
SUBJECTS = (
    "SchNet",
    register_variant(
        "PAINN+EquivariantTransformer",
        mpnn_type="PAINN",
        global_attn_engine="EquivariantTransformer",
        global_attn_heads=4,
    ),
)


def _samples(count: int = 4) -> list:
    out = []
    for i, atoms in enumerate(periodic_atoms()[:count]):
        raw = _label(atoms.copy())
        raw.total_charge = torch.tensor([[float(i % 3 - 1)]])
        raw.spin = torch.tensor([[float(i % 2)]])
        out.append(with_edges(prepare(raw, COND_SCHEMA, index=i), CUTOFF))
    return out


def _model(subject: str, mode: str, seed: int = 0, perturb: bool = True):
    """A tiny conditioned MLIP; ``perturb`` gives FiLM's zero-initialised last layer random
    weights (as training would), so that every mode acts from the start."""
    torch.manual_seed(seed)
    arch = small_arch(subject, use_graph_attr_conditioning=True, graph_attr_conditioning_mode=mode)
    model = build_model(arch, COND_SCHEMA).eval()
    if perturb and mode == "film":
        with torch.no_grad():
            last = model.conditioning.net[-1]
            last.weight.normal_(0.0, 0.3)
            last.bias.normal_(0.0, 0.3)
    return model


def _with_graph_attr(batch, graph_attr):
    out = batch.clone()
    out.graph_attr = graph_attr
    return out


# ----------------------------------------------------------------------------- the modes act
@pytest.mark.parametrize("subject", SUBJECTS)
@pytest.mark.parametrize("mode", MODES)
def test_outputs_depend_on_graph_attr(mode, subject):
    model = _model(subject, mode)
    if mode == "fuse_pool":
        assert model.conditioning is None and model.graph_heads.fuse is not None
    else:
        assert isinstance(model.conditioning, NodeConditioning) and model.conditioning.mode == mode
    batch = collate(_samples())
    other = _with_graph_attr(batch, batch.graph_attr + torch.tensor([[1.0, 2.0]]))
    ref, out = model(batch), model(other)
    assert (out["gap"] - ref["gap"]).abs().max() > 1e-4
    if mode == "fuse_pool":  # conditions the graph heads only: the MLIP energy is a sum of atomic energies
        torch.testing.assert_close(out["energy"], ref["energy"])
        torch.testing.assert_close(out["forces"], ref["forces"])
    else:
        assert (out["energy"] - ref["energy"]).abs().min() > 1e-5  # every graph's energy moves
        assert (out["forces"] - ref["forces"]).abs().max() > 1e-5


def test_film_starts_as_the_identity():
    """FiLM's last layers start at zero: an untrained model ignores graph_attr (trainable from there)."""
    model = _model("SchNet", "film", perturb=False)
    batch = collate(_samples())
    ref, out = model(batch), model(_with_graph_attr(batch, batch.graph_attr * 3.0 + 1.0))
    torch.testing.assert_close(out["energy"], ref["energy"])
    model.train()
    loss = model(batch)["energy"].square().sum()
    loss.backward()
    assert model.conditioning.net[-1].weight.grad.abs().max() > 0  # it can learn


def test_conditioning_is_off_by_default():
    torch.manual_seed(0)
    model = build_model(small_arch("SchNet"), COND_SCHEMA)
    assert model.conditioning is None and model.graph_heads.fuse is None


# ----------------------------------------------------------------------------- symmetry, batching
@pytest.mark.parametrize("mode", MODES)
def test_rotation_invariance_and_equivariance(mode):
    """Charge and spin are rotation-invariant: energies and gaps stay invariant, forces and the
    transformer's vectors rotate (PAINN + equivariant transformer + conditioning)."""
    model = _model(SUBJECTS[1], mode)
    batch = collate(_samples(3))
    rot = random_rotation(7)
    moved = batch.clone()
    moved.pos, moved.cell, moved.edge_shift = batch.pos @ rot.T, batch.cell @ rot.T, batch.edge_shift @ rot.T
    ref, out = model(batch), model(moved)
    for key in ("energy", "gap"):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["forces"], ref["forces"] @ rot.T, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        e_ref = model.encode(model.graph_inputs(batch, batch.pos, batch.edge_index, batch.edge_shift))
        e_out = model.encode(model.graph_inputs(moved, moved.pos, moved.edge_index, moved.edge_shift))
    torch.testing.assert_close(e_out.scalar, e_ref.scalar, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(e_out.vector, torch.einsum("ij,njc->nic", rot, e_ref.vector), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_batch_equals_single_and_padding(mode):
    model = _model("SchNet", mode)
    samples = _samples()
    batch = collate(samples)
    out = model(batch)
    singles = [model(collate([s])) for s in samples]
    for key in out:
        torch.testing.assert_close(out[key], torch.cat([s[key] for s in singles]), rtol=1e-5, atol=1e-6)
    padded = model(pad_with_sink(batch, extra_nodes=3, extra_edges=4))
    n, b = batch.num_nodes, batch.num_graphs
    torch.testing.assert_close(padded["energy"][:b], out["energy"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(padded["gap"][:b], out["gap"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(padded["forces"][:n], out["forces"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_capture_safe(mode):
    model = _model(SUBJECTS[1], mode)
    padded = pad_with_sink(collate(_samples(2)), extra_nodes=2, extra_edges=3)
    model(padded)
    with HostSyncDetector() as detector:
        model(padded)
    assert not detector.violations, sorted(set(detector.violations))


@pytest.mark.parametrize("mode", MODES)
def test_artifact_round_trip(mode, tmp_path):
    model = _model("SchNet", mode)
    batch = collate(_samples(3))
    loaded = load_artifact(save_artifact(model, tmp_path / f"{mode}.hydra", species=[29, 79]))
    assert loaded.config.conditioning.enabled and loaded.config.conditioning.mode == mode
    ref, out = model(batch), loaded(batch)
    for key in ref:
        assert torch.equal(ref[key], out[key]), f"output {key!r} differs after save/load"


# ----------------------------------------------------------------------------- errors
def test_conditioning_needs_graph_inputs():
    schema = Schema.from_dict(
        {
            "inputs": [
                {"name": "atomic_number", "level": "node", "dim": 1},
                {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            ],
            "outputs": [{"name": "energy", "level": "graph", "dim": 1}, {"name": "forces", "level": "node", "dim": 3}],
        }
    )
    arch = small_arch("SchNet", use_graph_attr_conditioning=True)
    with pytest.raises(ModelConfigError, match=r"use_graph_attr_conditioning: conditioning needs graph inputs"):
        build_model(arch, schema)


def test_fuse_pool_needs_graph_heads():
    """A pure MLIP (energy + forces) has no graph head to fuse into."""
    schema = Schema.from_dict(
        {
            "inputs": COND_SCHEMA.to_dict()["inputs"],
            "outputs": [{"name": "energy", "level": "graph", "dim": 1}, {"name": "forces", "level": "node", "dim": 3}],
        }
    )
    arch = small_arch("SchNet", use_graph_attr_conditioning=True, graph_attr_conditioning_mode="fuse_pool")
    with pytest.raises(ModelConfigError, match=r"graph_attr_conditioning_mode: fuse_pool conditions the graph heads"):
        build_model(arch, schema)
    arch["graph_attr_conditioning_mode"] = "film"
    assert build_model(arch, schema).conditioning is not None  # node modes work for a pure MLIP


def test_mode_errors():
    with pytest.raises(ModelConfigError, match=r"Architecture\.graph_attr_conditioning_mode: expected one of"):
        ModelConfig.from_dict({"mpnn_type": "SchNet", "graph_attr_conditioning_mode": "add"})
    with pytest.raises(ModelConfigError, match=r"graph_attr_conditioning_mode: node conditioning takes one of"):
        NodeConditioning("fuse_pool", 16, 2, "silu")
    with pytest.raises(ModelConfigError, match=r"use_graph_attr_conditioning: conditioning needs graph inputs"):
        NodeConditioning("film", 16, 0, "silu")
