"""HydraModel core: multi-level heads, MLIP options, dynamic graphs, padding, losses."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import Schema, prepare
from hydragnn.models import ModelError, build_model, compute_loss, pad_with_sink
from hydragnn.models.testing import CUTOFF, build, small_arch
from hydragnn.models.testing.graphs import (
    CLUSTER_SCHEMA,
    SCHEMA,
    brute_force_edges,
    cluster_samples,
    collate,
    periodic_samples,
    random_rotation,
)

GENERIC = Schema.from_dict(
    {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "charge_in", "level": "node", "dim": 2},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
            {"name": "bond_in", "level": "edge", "dim": 2},
            {"name": "temperature", "level": "graph", "dim": 1},
        ],
        "outputs": [
            {"name": "band_gap", "level": "graph", "dim": 2},
            {"name": "moment", "level": "node", "dim": 3},
            {"name": "bond_order", "level": "edge", "dim": 1},
        ],
    }
)


def _generic_batch(count: int = 3):
    g = torch.Generator().manual_seed(5)
    samples = []
    for i, base in enumerate(periodic_samples(CUTOFF)[:count]):
        n, e = base.num_nodes, base.edge_index.shape[1]
        raw = Data(
            atomic_number=base.atomic_number,
            pos=base.pos,
            cell=base.cell,
            pbc=base.pbc,
            edge_index=base.edge_index,
            edge_shift=base.edge_shift,
            charge_in=torch.randn(n, 2, generator=g),
            bond_in=torch.randn(e, 2, generator=g),
            temperature=torch.rand(1, 1, generator=g),
            band_gap=torch.randn(1, 2, generator=g),
            moment=torch.randn(n, 3, generator=g),
            bond_order=torch.randn(e, 1, generator=g),
        )
        samples.append(prepare(raw, GENERIC, index=i))
    return collate(samples)


@pytest.mark.parametrize("node_type", ["mlp", "conv"])
@pytest.mark.parametrize("pooling", ["mean", "add", "max"])
def test_generic_heads_shapes_and_invariance(node_type, pooling):
    torch.manual_seed(0)
    arch = {
        "mpnn_type": "SchNet",
        "hidden_dim": 8,
        "num_conv_layers": 1,
        "radius": CUTOFF,
        "graph_pooling": pooling,
        "output_heads": {"node": {"type": node_type, "num_headlayers": 2}, "edge": {"num_headlayers": 1}},
    }
    model = build_model(arch, GENERIC).eval()
    batch = _generic_batch()
    out = model(batch)
    assert out["band_gap"].shape == (3, 2)
    assert out["moment"].shape == (batch.num_nodes, 3)
    assert out["bond_order"].shape == (batch.edge_index.shape[1], 1)
    rot = random_rotation(2)
    moved = batch.clone()
    moved.pos, moved.edge_shift = batch.pos @ rot.T + 1.0, batch.edge_shift @ rot.T
    for key, value in model(moved).items():
        torch.testing.assert_close(value, out[key], rtol=1e-4, atol=1e-5)
    loss, parts = model.loss(out, batch)
    assert sorted(parts) == ["band_gap", "bond_order", "moment"] and torch.isfinite(loss)
    # graph inputs reach the graph heads
    other = batch.clone()
    other.graph_attr = batch.graph_attr + 1.0
    assert not torch.allclose(model(other)["band_gap"], out["band_gap"])


def test_single_data_and_no_grad():
    model = build("SchNet")
    data = periodic_samples(CUTOFF)[0]
    with torch.no_grad():
        out = model(data)
    assert out["energy"].shape == (1, 1) and out["forces"].shape == (data.num_nodes, 3)
    assert out["stress"].shape == (1, 6)
    assert all(not v.requires_grad for v in out.values())
    torch.testing.assert_close(out["forces"], model(collate([data]))["forces"])


def test_training_mode_keeps_force_graph():
    model = build("SchNet").train()
    out = model(collate(periodic_samples(CUTOFF)[:2]))
    assert out["forces"].requires_grad and out["stress"].requires_grad
    model.eval()
    out = model(collate(periodic_samples(CUTOFF)[:2]))
    assert not out["forces"].requires_grad


def test_atomic_energy_and_reference_energies():
    batch = collate(periodic_samples(CUTOFF)[:4])
    plain = build("SchNet", seed=4)
    shifted = build("SchNet", seed=4, reference_energies={"29": -1.25, "79": 0.5})
    a, b = plain(batch), shifted(batch)
    z = batch.atomic_number.view(-1)
    ref = torch.where(z == 29, -1.25, 0.5).unsqueeze(-1)
    torch.testing.assert_close(b["atomic_energy"], a["atomic_energy"] + ref)
    sums = torch.zeros(4, 1).index_add(0, batch.batch, b["atomic_energy"])
    torch.testing.assert_close(b["energy"], sums, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(b["forces"], a["forces"])  # constants do not change forces


def test_compute_flags_and_direct_forces():
    model = build("SchNet")
    batch = collate(periodic_samples(CUTOFF)[:2])
    out = model(batch, compute_forces=False, compute_stress=False)
    assert "forces" not in out and "stress" not in out and "energy" in out
    clusters = collate(cluster_samples(CUTOFF))
    cmodel = build("SchNet", schema=CLUSTER_SCHEMA)
    with pytest.raises(ModelError, match="stress needs a periodic batch"):
        cmodel(clusters, compute_stress=True)
    assert "stress" not in cmodel(clusters)
    direct = build("SchNet", compute_grad_energy=False)
    out = direct(batch)
    assert out["forces"].shape == (batch.num_nodes, 3) and "forces" in direct.node_heads.heads
    assert "stress" in direct.graph_heads.heads  # without autograd the stress is an ordinary head


def _fake_neighbors(calls):
    def radius_graph(pos, cutoff, batch=None, cell=None, pbc=None, max_neighbours=None):
        calls.append(max_neighbours)
        batch = torch.zeros(pos.shape[0], dtype=torch.long) if batch is None else batch
        edges, shifts, start = [], [], 0
        for g in range(int(batch.max()) + 1):
            idx = (batch == g).nonzero().view(-1)
            c = cell[g] if cell is not None else None
            p = pbc[g] if pbc is not None else None
            e, s = brute_force_edges(pos[idx], cutoff, c, p)
            edges.append(e + start)
            shifts.append(s)
            start += idx.numel()
        return torch.cat(edges, 1), torch.cat(shifts)

    return types.SimpleNamespace(radius_graph=radius_graph)


@pytest.mark.parametrize("periodic", [True, False])
def test_dynamic_graph_matches_static_edges(monkeypatch, periodic):
    calls = []
    monkeypatch.setitem(sys.modules, "hydragnn.data.neighbors", _fake_neighbors(calls))
    schema = SCHEMA if periodic else CLUSTER_SCHEMA
    batch = collate(periodic_samples(CUTOFF)[:3] if periodic else cluster_samples(CUTOFF))
    static = build("SchNet", schema=schema, seed=2)
    dynamic = build("SchNet", schema=schema, seed=2, dynamic_graph=True, max_neighbours=64)
    ref, out = static(batch), dynamic(batch)
    assert calls == [64]
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=1e-5, atol=1e-6)
    no_edges = batch.clone()
    del no_edges.edge_index, no_edges.edge_shift
    out = static(no_edges)  # an MLIP without edges builds them
    torch.testing.assert_close(out["forces"], ref["forces"], rtol=1e-5, atol=1e-6)


def test_dynamic_graph_with_hydra_data_neighbors():
    pytest.importorskip("hydragnn.data.neighbors")
    batch = collate(periodic_samples(CUTOFF)[:2])
    static = build("SchNet", seed=2)
    dynamic = build("SchNet", seed=2, dynamic_graph=True)
    ref, out = static(batch), dynamic(batch)
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=1e-5, atol=1e-6)


def test_non_mlip_model_needs_edges():
    model = build_model({**small_arch("SchNet"), "enable_interatomic_potential": False}, SCHEMA)
    batch = collate(periodic_samples(CUTOFF)[:1])
    del batch.edge_index
    with pytest.raises(ModelError, match="no 'edge_index'"):
        model(batch)


def test_pad_with_sink_sizes_and_errors():
    batch = collate(periodic_samples(CUTOFF)[:2])
    n, e = batch.num_nodes, batch.edge_index.shape[1]
    padded = pad_with_sink(batch, num_nodes=n + 5, num_edges=e + 9)
    assert padded.num_nodes == n + 5 and padded.edge_index.shape[1] == e + 9 and padded.num_graphs == 3
    assert padded.cell.shape == (3, 3, 3) and padded.pbc.shape == (3, 3) and not padded.pbc[-1].any()
    assert padded.node_output.shape[0] == n + 5 and padded.graph_output.shape[0] == 3
    assert (padded.edge_index[:, e:] == n).all() and (padded.batch[n:] == 2).all()
    assert padded.ptr.tolist() == batch.ptr.tolist() + [n + 5]
    single = pad_with_sink(periodic_samples(CUTOFF)[0])
    assert single.num_graphs == 2
    with pytest.raises(ModelError, match="at least one sink node"):
        pad_with_sink(batch, num_nodes=n)
    with pytest.raises(ModelError, match="no negative edge count"):
        pad_with_sink(batch, num_edges=e - 1)


@pytest.mark.parametrize("loss_type", ["mse", "mae", "huber", "smooth_l1"])
def test_compute_loss_types_and_weights(loss_type):
    batch = collate(periodic_samples(CUTOFF)[:3])
    model = build("SchNet", loss_function_type=loss_type, huber_delta=0.5, task_weights=[2.0, 0.0, 1.0, 3.0, 1.0, 0.5])
    out = model(batch)
    total, parts = model.loss(out, batch)
    fn = {
        "mse": torch.nn.functional.mse_loss,
        "mae": torch.nn.functional.l1_loss,
        "huber": lambda p, t: torch.nn.functional.huber_loss(p, t, delta=0.5),
        "smooth_l1": lambda p, t: torch.nn.functional.smooth_l1_loss(p, t, beta=0.5),
    }[loss_type]
    slices = SCHEMA.output_slices()
    natoms = (batch.ptr[1:] - batch.ptr[:-1]).reshape(-1, 1).float()
    assert len(set(natoms.flatten().tolist())) > 1  # structures of different sizes
    expected = 0.0
    for var, w in zip(SCHEMA.outputs, [2.0, 0.0, 1.0, 3.0, 1.0, 0.5]):
        target = getattr(batch, f"{var.level}_output")[:, slices[var.name]]
        pred = out[var.name]
        if var.name == "energy":  # energy_loss "per_atom" (the MLIP default): E / N against E_ref / N
            pred, target = pred / natoms, target / natoms
        value = fn(pred, target)
        torch.testing.assert_close(parts[var.name], value)
        expected = expected + w * value
    torch.testing.assert_close(total, expected)
    same, _ = compute_loss(
        out, batch, SCHEMA, task_weights=model.task_weights, loss_type=loss_type, huber_delta=0.5, per_atom=("energy",)
    )
    torch.testing.assert_close(same, total)
    model_total = build("SchNet", loss_function_type=loss_type, huber_delta=0.5, energy_loss="total")
    _, parts_total = model_total.loss(out, batch)
    torch.testing.assert_close(parts_total["energy"], fn(out["energy"], batch.graph_output[:, slices["energy"]]))


def test_compute_loss_errors():
    batch = collate(periodic_samples(CUTOFF)[:2])
    out = build("SchNet")(batch)
    with pytest.raises(ModelError, match="loss_function_type"):
        compute_loss(out, batch, SCHEMA, loss_type="l4")
    with pytest.raises(ModelError, match="output 'gap': no prediction"):
        compute_loss({k: v for k, v in out.items() if k != "gap"}, batch, SCHEMA)
    with pytest.raises(ModelError, match="prediction shape"):
        compute_loss({**out, "gap": out["gap"][:, :1]}, batch, SCHEMA)
    with pytest.raises(ModelError, match="expected 6 weights"):
        compute_loss(out, batch, SCHEMA, task_weights=[1.0])
    bare = batch.clone()
    del bare.node_output
    with pytest.raises(ModelError, match="no 'node_output' targets"):
        compute_loss(out, bare, SCHEMA)


def test_cached_test_graphs_do_not_depend_on_the_first_callers_default_dtype():
    """The shared test graphs are cached: built under a float64 default they must still be float32."""
    from hydragnn.models.testing.graphs import cluster_samples, default_dtype, periodic_samples

    periodic_samples.cache_clear()
    cluster_samples.cache_clear()
    with default_dtype(torch.float64):
        built = [*periodic_samples(CUTOFF), *cluster_samples(CUTOFF)]
    for sample in built:
        for key, value in sample:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert value.dtype == torch.float32, key


def test_output_scaling_is_an_affine_on_the_head_and_a_normalised_loss():
    """``output_scaling``: ``shift + scale * network`` per column on that head only; its loss is the
    unscaled model's loss on normalised targets; the state dict is unchanged."""
    arch = {
        "mpnn_type": "SchNet",
        "hidden_dim": 8,
        "num_conv_layers": 1,
        "radius": CUTOFF,
        "output_heads": {"node": {"num_headlayers": 1}, "edge": {"num_headlayers": 1}},
    }
    shift, scale = [3.0, -1.0], [10.0, 0.5]
    scaled_arch = {**arch, "output_scaling": {"band_gap": {"shift": shift, "scale": scale}}}
    torch.manual_seed(0)
    plain = build_model(arch, GENERIC).eval()
    torch.manual_seed(0)
    scaled = build_model(scaled_arch, GENERIC).eval()
    assert plain.state_dict().keys() == scaled.state_dict().keys()
    batch = _generic_batch()
    with torch.no_grad():
        got, ref = scaled(batch), plain(batch)
    shift_t, scale_t = torch.tensor(shift), torch.tensor(scale)
    torch.testing.assert_close(got["band_gap"], shift_t + scale_t * ref["band_gap"])
    torch.testing.assert_close(got["moment"], ref["moment"])  # other heads untouched
    loss, heads = scaled.loss(got, batch)
    normalised = batch.clone()
    slices = GENERIC.output_slices()["band_gap"]
    normalised.graph_output[:, slices] = (batch.graph_output[:, slices] - shift_t) / scale_t
    _, ref_heads = plain.loss(ref, normalised)
    torch.testing.assert_close(heads["band_gap"], ref_heads["band_gap"])
    torch.testing.assert_close(heads["moment"], ref_heads["moment"])


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"nope": {"shift": [0.0], "scale": [1.0]}}, "not an output of Variables"),
        ({"band_gap": {"shift": [0.0], "scale": [1.0]}}, "1 columns, the output has dim 2"),
        ({"band_gap": {"shift": [0.0, 0.0], "scale": [1.0, -1.0]}}, "scales > 0"),
        ({"band_gap": {"shift": [0.0, 0.0]}}, "expected {'shift'"),
    ],
)
def test_output_scaling_errors_name_the_key(scaling, message):
    arch = {"mpnn_type": "SchNet", "hidden_dim": 8, "num_conv_layers": 1, "radius": CUTOFF}
    with pytest.raises((ModelError, ValueError), match=message):
        build_model({**arch, "output_scaling": scaling}, GENERIC)


def test_output_scaling_refuses_the_potentials_energy():
    with pytest.raises(ModelError, match="output_scaling.energy: the interatomic potential's output"):
        build_model({**small_arch("SchNet"), "output_scaling": {"energy": {"shift": [0.0], "scale": [2.0]}}}, SCHEMA)
