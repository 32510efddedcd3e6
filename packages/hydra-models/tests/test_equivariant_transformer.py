"""The equivariant all-to-all transformer: the conformance suite (standalone, after SchNet, after
PAINN), every encoder followed by it, attention beyond the cutoff, config rules, safe geometry."""

from __future__ import annotations

import pytest
import torch

from hydragnn.data import Schema
from hydragnn.models import ModelConfig, ModelConfigError, build_model
from hydragnn.models.attention import equivariant_transformer
from hydragnn.models.attention.equivariant_transformer import (
    EquivariantAttentionLayer,
    EquivariantTransformer,
    graph_layout,
)
from hydragnn.models.nn import CosineCutoff, GaussianRBF
from hydragnn.models.nn.geometry import dense_pair_geometry, minimum_image, pair_geometry
from hydragnn.models.testing import CUTOFF, REGISTERED_ENCODERS, EncoderConformance, build, register_variant, small_arch
from hydragnn.models.testing.graphs import (
    CLUSTER_SCHEMA,
    SCHEMA,
    cluster_samples,
    collate,
    default_dtype,
    periodic_samples,
    random_rotation,
    to_dtype,
    with_edges,
)

ET = {"global_attn_engine": "EquivariantTransformer", "global_attn_heads": 4}
VARIANTS = [
    register_variant("EquivariantTransformer", mpnn_type=None, **ET),
    register_variant("SchNet+EquivariantTransformer", mpnn_type="SchNet", **ET),
    register_variant("PAINN+EquivariantTransformer", mpnn_type="PAINN", **ET),
]


@pytest.mark.parametrize("encoder_name", VARIANTS)
class TestEquivariantTransformerConformance(EncoderConformance):
    """Invariance, equivariance, forces / stress vs finite differences, batching, padding,
    capture safety, artifacts, dtypes, checkpointing."""

    def test_periodic_supercell(self, encoder_name):
        pytest.skip(
            "the all-to-all stage counts each pair once, at its minimum image, and softmax-normalises over "
            "the atoms of the cell: a supercell has more atoms and other images in reach, so per-atom "
            "energies differ by design (wrapping invariance is tested in test_energy_invariant_to_wrapping)"
        )


def _encode(model, batch):
    inputs = model.graph_inputs(batch, batch.pos, batch.edge_index, getattr(batch, "edge_shift", None))
    return model.encode(inputs)


def _rotated(batch, rot):
    moved = batch.clone()
    moved.pos = batch.pos @ rot.T
    return moved


# ----------------------------------------------------------------------------- structure
def test_standalone_and_staged_structure():
    standalone = build("EquivariantTransformer", global_attn_layers=3)
    assert isinstance(standalone.encoder, EquivariantTransformer) and standalone.global_stage is None
    assert len(standalone.encoder.layers) == 3  # global_attn_layers sets the depth
    staged = build("PAINN+EquivariantTransformer", num_vector_channels=5)
    et = staged.global_stage
    assert isinstance(et, EquivariantTransformer) and len(et.layers) == 2  # default: num_conv_layers
    assert et.local_channels == 5 and tuple(et.vector_in.weight.shape) == (16, 5) and et.vector_in.bias is None
    assert build("SchNet+EquivariantTransformer").global_stage.vector_in is None  # invariant encoder: C = 0
    emb = _encode(staged, collate(periodic_samples(CUTOFF)[:2]))
    assert emb.scalar.shape == (emb.scalar.shape[0], 16) and emb.vector.shape == (emb.scalar.shape[0], 3, 16)


@pytest.mark.parametrize("encoder_name", REGISTERED_ENCODERS)
def test_every_encoder_followed_by_the_transformer(encoder_name):
    """Builds after every encoder, projects its vectors, and keeps its symmetry: when the encoder
    alone is rotation-invariant / -equivariant, so is encoder + transformer."""
    arch = small_arch(encoder_name, **ET)
    try:
        torch.manual_seed(0)
        model = build_model(arch, CLUSTER_SCHEMA).eval()
        torch.manual_seed(0)
        local_only = build_model(small_arch(encoder_name), CLUSTER_SCHEMA).eval()
    except ModelConfigError as err:  # an optional backend (fairchem) that is not installed
        if "pip install" in str(err):
            pytest.skip(str(err))
        raise
    assert (model.global_stage.vector_in is not None) == (model.encoder.vector_channels > 0)
    batch = collate(cluster_samples(CUTOFF)[:2])
    rot = random_rotation(4)
    with torch.no_grad():
        ref, out = _encode(model, batch), _encode(model, _rotated(batch, rot))
        local_ref, local_out = _encode(local_only, batch), _encode(local_only, _rotated(batch, rot))
    n = batch.num_nodes
    assert ref.scalar.shape == (n, 16) and ref.vector.shape == (n, 3, 16)
    assert torch.isfinite(ref.scalar).all() and torch.isfinite(ref.vector).all()
    local_symmetric = torch.allclose(local_out.scalar, local_ref.scalar, rtol=1e-4, atol=1e-5) and (
        local_ref.vector is None
        or torch.allclose(local_out.vector, torch.einsum("ij,njc->nic", rot, local_ref.vector), rtol=1e-4, atol=1e-5)
    )
    if not local_symmetric:
        pytest.skip(f"{encoder_name} alone is not rotation invariant / equivariant (by design)")
    torch.testing.assert_close(out.scalar, ref.scalar, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.vector, torch.einsum("ij,njc->nic", rot, ref.vector), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- all-to-all
def _two_atoms_far_apart(distance: float):
    from hydragnn.data import prepare

    raw = cluster_samples(CUTOFF)[0]
    pos = torch.tensor([[0.0, 0.0, 0.0], [distance, 0.3, -0.2]])
    sample = type(raw)(
        atomic_number=torch.tensor([[29], [79]]),
        pos=pos,
        energy=torch.zeros(1, 1),
        gap=torch.zeros(1, 2),
        atomic_energy=torch.zeros(2, 1),
        forces=torch.zeros(2, 3),
        charge=torch.zeros(2, 1),
    )
    return collate([with_edges(prepare(sample, CLUSTER_SCHEMA), CUTOFF)])


def test_attention_reaches_beyond_the_cutoff():
    """Two atoms 2.5 cutoffs apart: no edge, yet with the transformer each one's energy depends
    on the other's position (the local encoder alone sees nothing)."""
    a, b = _two_atoms_far_apart(2.5 * CUTOFF), _two_atoms_far_apart(2.0 * CUTOFF)
    assert a.edge_index.shape[1] == 0
    for name in ("EquivariantTransformer", "SchNet+EquivariantTransformer"):
        model = build(name, schema=CLUSTER_SCHEMA)
        out_a, out_b = model(a), model(b)
        assert not torch.allclose(out_a["atomic_energy"], out_b["atomic_energy"], atol=1e-6)
        assert out_a["forces"].abs().max() > 1e-8  # a force acts across the gap
        torch.testing.assert_close(out_a["forces"].sum(0), torch.zeros(3), atol=1e-6, rtol=0)  # Newton's 3rd law
    local = build("SchNet", schema=CLUSTER_SCHEMA)
    torch.testing.assert_close(local(a)["atomic_energy"], local(b)["atomic_energy"])


def test_graphs_do_not_attend_to_each_other():
    """Moving one graph of a batch leaves the other graphs' outputs unchanged (the batch mask)."""
    model = build("EquivariantTransformer")
    samples = periodic_samples(CUTOFF)[:3]
    batch = collate(samples)
    moved = batch.clone()
    first = batch.batch == 0
    moved.pos = torch.where(first.unsqueeze(-1), batch.pos + torch.tensor([0.4, -0.2, 0.1]) * batch.pos, batch.pos)
    ref, out = model(batch), model(moved)
    assert not torch.allclose(out["energy"][0], ref["energy"][0])
    torch.testing.assert_close(out["energy"][1:], ref["energy"][1:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["forces"][~first], ref["forces"][~first], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
def test_training_layout_equals_the_capture_layout(name, monkeypatch):
    """Training lays the batch out per graph ([B, n_max] blocks), eval as one masked [N, N] block
    (capture-safe): the same function, in float64 to 1e-10, on periodic cells and on clusters of
    different sizes; the per-graph geometry is built in training only, at [B, n_max, n_max]."""
    shapes = []

    def spy(pos, *args):
        shapes.append(tuple(pos.shape))
        return dense_pair_geometry(pos, *args)

    monkeypatch.setattr(equivariant_transformer, "dense_pair_geometry", spy)
    with default_dtype(torch.float64):
        for schema, samples in ((SCHEMA, periodic_samples(CUTOFF)), (CLUSTER_SCHEMA, cluster_samples(CUTOFF))):
            model = build(name, schema=schema, precision="fp64")
            batch = collate([to_dtype(d, torch.float64) for d in samples])
            counts = torch.bincount(batch.batch)
            assert len(set(counts.tolist())) > 1 or schema is SCHEMA
            captured = model.eval()(batch)
            assert not shapes
            trained = model.train()(batch)
            assert shapes == [(len(samples), int(counts.max()), 3)]
            shapes.clear()
            for key in ("energy", "forces") + (("stress",) if schema is SCHEMA else ()):
                torch.testing.assert_close(trained[key], captured[key], rtol=1e-10, atol=1e-10)


def test_graph_layout_keeps_node_order_within_each_graph():
    """Slots of an unsorted batch: each node's rank within its graph, and the largest graph."""
    slot, width = graph_layout(torch.tensor([1, 0, 1, 2, 0, 1]), 4)
    assert slot.tolist() == [0, 0, 1, 0, 1, 2] and width == 3


# ----------------------------------------------------------------------------- geometry
def test_pair_geometry_is_safe_for_coincident_atoms():
    """Coincident atoms (the padding sink) give zero direction, finite first and second derivatives."""
    pos = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 2.0, 2.0]], dtype=torch.float64, requires_grad=True)
    batch = torch.zeros(3, dtype=torch.long)
    dist, unit, same = pair_geometry(pos, batch, torch.float64)
    assert torch.equal(dist[0, 1], torch.zeros((), dtype=torch.float64)) and torch.equal(
        unit[0, 1], torch.zeros(3, dtype=torch.float64)
    )
    torch.testing.assert_close(dist[0, 2], torch.tensor(3.0, dtype=torch.float64))
    torch.testing.assert_close(unit[0, 2].norm(), torch.tensor(3.0 / (9.0 + 1e-4) ** 0.5, dtype=torch.float64))
    assert bool(same.all())
    energy = (dist.square() * 0.1 + unit.sum(-1)).sum() + dist.sum()
    (grad,) = torch.autograd.grad(energy, pos, create_graph=True)
    (second,) = torch.autograd.grad(grad.square().sum(), pos)
    assert torch.isfinite(grad).all() and torch.isfinite(second).all()


def test_layer_is_exactly_equivariant_in_float64():
    """One layer on random scalars / vectors: vectors rotate, scalars do not (float64, 1e-12)."""
    torch.manual_seed(0)
    layer = EquivariantAttentionLayer(8, 2, 6).double()
    n = 7
    s = torch.randn(n, 8, dtype=torch.float64)
    v = torch.randn(n, 3, 8, dtype=torch.float64)
    pos = torch.randn(n, 3, dtype=torch.float64) * 2
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    rot = random_rotation(2, torch.float64)
    rbf, local_rbf, env = GaussianRBF(8.0, 6).double(), GaussianRBF(4.0, 6).double(), CosineCutoff(4.0)
    dist, unit, same = pair_geometry(pos, batch, torch.float64)
    assert 0 < float(env(dist).mean()) < 1  # some pairs inside the filter range, some beyond

    def run(vectors, dist, unit, same):  # the layer takes [B, n, ...] blocks: one block of n here
        out = layer(
            s[None], vectors[None], rbf(dist)[None], local_rbf(dist)[None], env(dist)[None], unit[None], same[None]
        )
        return out[0][0], out[1][0]

    s1, v1 = run(v, dist, unit, same)
    dist, unit, same = pair_geometry(pos @ rot.T + 1.5, batch, torch.float64)
    s2, v2 = run(torch.einsum("ij,njc->nic", rot, v), dist, unit, same)
    torch.testing.assert_close(s2, s1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v2, torch.einsum("ij,njc->nic", rot, v1), rtol=1e-12, atol=1e-12)
    assert v1.abs().max() > 1e-3  # the vectors are not trivially zero


def test_minimum_image_vectors():
    """Pair vectors are lattice translates of the raw ones, with fractional coordinates in
    [-0.5, 0.5] along periodic directions, untouched along non-periodic ones (a zero row gives no
    NaN), and differentiable in positions and cell (finite gradients)."""
    gen = torch.Generator().manual_seed(3)
    cell = torch.tensor(
        [[[6.0, 0.4, 0.2], [0.3, 5.5, -0.1], [0.1, 0.2, 7.0]], [[5.0, 0.0, 0.0], [0.5, 6.0, 0.0], [0.0, 0.0, 0.0]]],
        dtype=torch.float64,
        requires_grad=True,
    )
    pbc = torch.tensor([[True, True, True], [True, True, False]])
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    pos = (torch.rand(7, 3, generator=gen, dtype=torch.float64) * 20 - 10).requires_grad_(True)
    raw = pos.unsqueeze(0) - pos.unsqueeze(1)
    rel = minimum_image(raw, batch, cell, pbc)
    assert torch.isfinite(rel).all()
    same = batch.unsqueeze(0) == batch.unsqueeze(1)
    pairs = same & (batch.unsqueeze(1) == 0)  # graph 0: periodic in 3-D, triclinic
    inv = torch.linalg.inv(cell.detach()[0])
    frac, frac_raw = rel.detach()[pairs] @ inv, raw.detach()[pairs] @ inv
    assert frac.abs().max() <= 0.5 + 1e-9  # nearest image along every periodic direction
    torch.testing.assert_close(frac_raw - frac, (frac_raw - frac).round(), rtol=0, atol=1e-9)  # a lattice translate
    assert (frac_raw - frac).abs().max() >= 1  # the positions span several cells: vectors did move
    pairs = same & (batch.unsqueeze(1) == 1)  # graph 1: periodic in x, y; zero third row
    frac = rel.detach()[pairs][:, :2] @ torch.linalg.inv(cell.detach()[1, :2, :2])
    assert frac.abs().max() <= 0.5 + 1e-9
    torch.testing.assert_close(rel[pairs][:, 2], raw[pairs][:, 2])  # non-periodic z untouched
    dist = pair_geometry(pos, batch, torch.float64, cell, pbc)[0]
    grad_pos, grad_cell = torch.autograd.grad(dist.sum(), (pos, cell))
    assert torch.isfinite(grad_pos).all() and torch.isfinite(grad_cell).all()
    assert grad_cell[0].abs().max() > 0  # the cell enters the pair vectors
    # a singular periodic cell is left alone (no NaN), pbc None means periodic everywhere
    flat = minimum_image(raw.detach(), batch, torch.zeros(2, 3, 3, dtype=torch.float64), None)
    torch.testing.assert_close(flat, raw.detach())


@pytest.mark.parametrize("name", ["EquivariantTransformer", "SchNet+EquivariantTransformer"])
def test_energy_invariant_to_wrapping(name):
    """Moving atoms by lattice vectors changes neither energy, forces nor stress (minimum image);
    without the cell the stage would see the moved atoms elsewhere (the check is not vacuous)."""
    model = build(name)
    sample = periodic_samples(CUTOFF)[1]
    cell = sample.cell.reshape(3, 3)
    moved = sample.clone()
    moved.pos = sample.pos.clone()
    moved.pos[0] += cell[0] - 2 * cell[2]
    moved.pos[3] -= cell[1]
    moved.pos[5] += cell[0] + cell[1] + cell[2]
    moved = with_edges(moved, CUTOFF)
    ref, out = model(collate([sample])), model(collate([moved]))
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
    a, b = collate([sample]), collate([moved])
    del a.cell, b.cell
    with torch.no_grad():
        assert not torch.allclose(_encode(model, a).scalar, _encode(model, b).scalar, atol=1e-3)


def test_value_filters_are_local():
    """Beyond ``radius`` an atom's values reach the others through content attention only: with the
    attention bias switched off, moving a far atom further away changes nothing, moving a near one does."""
    torch.manual_seed(0)
    layer = EquivariantAttentionLayer(8, 2, 6).double()
    with torch.no_grad():
        layer.bias.weight.zero_()
    rbf, local_rbf, env = GaussianRBF(8.0, 6).double(), GaussianRBF(4.0, 6).double(), CosineCutoff(4.0)
    s = torch.randn(3, 8, dtype=torch.float64)
    v = torch.randn(3, 3, 8, dtype=torch.float64)
    batch = torch.zeros(3, dtype=torch.long)

    def run(x_far: float, x_near: float):
        pos = torch.tensor([[0.0, 0.0, 0.0], [x_near, 0.5, 0.0], [x_far, 0.0, 1.0]], dtype=torch.float64)
        dist, unit, same = pair_geometry(pos, batch, torch.float64)
        out = layer(s[None], v[None], rbf(dist)[None], local_rbf(dist)[None], env(dist)[None], unit[None], same[None])
        return out[0][0], out[1][0]

    ref = run(6.0, 1.5)  # atom 2 is > 4 Å from atoms 0 and 1
    far = run(8.0, 1.5)
    near = run(6.0, 2.0)
    torch.testing.assert_close(far[0][:2], ref[0][:2], rtol=0, atol=1e-12)
    torch.testing.assert_close(far[1][:2], ref[1][:2], rtol=0, atol=1e-12)
    assert not torch.allclose(near[0][0], ref[0][0], atol=1e-6) and not torch.allclose(near[1][0], ref[1][0], atol=1e-6)


# ----------------------------------------------------------------------------- config rules
BASE = {"hidden_dim": 16, "global_attn_engine": "EquivariantTransformer"}


@pytest.mark.parametrize(
    ("arch", "match"),
    [
        ({**BASE, "global_attn_heads": 3}, r"global_attn_heads: hidden_dim \(16\) must be a multiple"),
        ({**BASE, "global_attn_type": "performer"}, r"global_attn_type: only used with global_attn_engine \"GPS\""),
        ({**BASE, "pe_dim": 4}, r"pe_dim: only used with global_attn_engine \"GPS\""),
        ({**BASE, "global_attn_layers": 0}, r"global_attn_layers: expected a value > 0"),
        ({"mpnn_type": "SchNet", "global_attn_layers": 2}, r"global_attn_layers: only used with"),
        ({"hidden_dim": 16}, r"mpnn_type: required"),
        ({**BASE, "num_filters": 8}, r"num_filters: unknown key; .*standalone EquivariantTransformer"),
    ],
)
def test_config_errors_name_the_key(arch, match):
    with pytest.raises(ModelConfigError, match=rf"NeuralNetwork\.Architecture\.{match}"):
        ModelConfig.from_dict(arch)


def test_transformer_needs_positions():
    schema = Schema.from_dict(
        {
            "inputs": [{"name": "atomic_number", "level": "node", "dim": 1}],
            "outputs": [{"name": "gap", "level": "graph", "dim": 1}],
        }
    )
    with pytest.raises(ModelConfigError, match=r"global_attn_engine: EquivariantTransformer needs positions"):
        build_model({"mpnn_type": "GIN", **BASE}, schema)


def test_standalone_uses_the_schema():
    """A standalone transformer MLIP also runs with stress and the extra heads of the test schema."""
    model = build("EquivariantTransformer", schema=SCHEMA)
    out = model(collate(periodic_samples(CUTOFF)[:2]))
    assert set(out) == {"energy", "gap", "atomic_energy", "forces", "charge", "stress"}
    assert all(torch.isfinite(t).all() for t in out.values())
