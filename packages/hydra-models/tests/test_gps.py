"""GPS global attention: config rules, every (encoder x attention type) combination, the
conformance suite on representative variants, per-graph attention, the performer approximation
and its redraw, positional encodings in the model."""

from __future__ import annotations

import pytest
import torch

from hydragnn.data import add_positional_encodings
from hydragnn.models import (
    ENCODERS,
    ModelConfig,
    ModelConfigError,
    ModelError,
    build_model,
    load_artifact,
    pad_with_sink,
    redraw_projections,
    save_artifact,
)
from hydragnn.models.attention import GPSLayer, MultiheadAttention, PerformerAttention
from hydragnn.models.encoders import GraphInputs
from hydragnn.models.testing import CUTOFF, EncoderConformance, build, register_variant, small_arch
from hydragnn.models.testing.graphs import CLUSTER_SCHEMA, cluster_samples, collate, periodic_samples, random_rotation

CONFORMANCE_VARIANTS = [
    register_variant(
        "SchNet+GPS-multihead", mpnn_type="SchNet", global_attn_engine="GPS", global_attn_type="multihead"
    ),
    register_variant("PAINN+GPS-performer", mpnn_type="PAINN", global_attn_engine="GPS", global_attn_type="performer"),
    register_variant("MACE+GPS-multihead", mpnn_type="MACE", global_attn_engine="GPS", global_attn_type="multihead"),
]
MIXING_ENCODERS = sorted(name for name, cls in ENCODERS.items() if cls.supports_layer_mixing)


@pytest.mark.parametrize("encoder_name", CONFORMANCE_VARIANTS)
class TestGPSConformance(EncoderConformance):
    """Invariance, equivariance, forces, batching, padding, capture safety, artifacts, dtypes."""


# ----------------------------------------------------------------------------- config rules
GPS = {"mpnn_type": "SchNet", "hidden_dim": 16, "global_attn_engine": "GPS"}


@pytest.mark.parametrize(
    ("arch", "match"),
    [
        ({**GPS, "global_attn_heads": 3}, r"global_attn_heads: hidden_dim \(16\) must be a multiple"),
        ({**GPS, "mpnn_type": "DimeNet"}, "global_attn_engine: GPS mixes attention"),
        ({"mpnn_type": "SchNet", "pe_dim": 4}, "pe_dim: only used with global_attn_engine"),
        ({"mpnn_type": "SchNet", "global_attn_type": "performer"}, "global_attn_type: only used with"),
        ({**GPS, "global_attn_type": "linear"}, "global_attn_type: expected one of"),
        ({**GPS, "pe_dim": -1}, r"pe_dim: expected a value >= 0"),
        ({**GPS, "global_attn_features": 0}, r"global_attn_features: expected a value > 0"),
        ({**GPS, "global_attn_heads": 0}, r"global_attn_heads: expected a value > 0"),
        ({**GPS, "global_attn_engine": "Transformer"}, "global_attn_engine: expected one of"),
        ({**GPS, "pe_dim": 2, "dynamic_graph": True}, "pe_dim: positional encodings come from the prepared"),
    ],
)
def test_config_errors_name_the_key(arch, match):
    with pytest.raises(ModelConfigError, match=rf"NeuralNetwork\.Architecture\.{match}"):
        ModelConfig.from_dict(arch)


@pytest.mark.parametrize("engine", ["None", None])
def test_engine_none_as_the_seed_writes_it_means_no_global_attention(engine):
    # the seed lists the accepted engines as "EquivariantTransformer, GPS, None": the string "None"
    # is the same as JSON null (and leaves hidden_dim free of the heads rule)
    from hydragnn.data.config_parse import to_json

    arch = small_arch("SchNet", global_attn_engine=engine, global_attn_heads=3)
    cfg = ModelConfig.from_dict(arch)
    assert cfg.attention.engine is None and to_json(cfg.attention)["global_attn_engine"] is None
    model = build_model(arch, CLUSTER_SCHEMA)
    assert model.encoder.mixers is None and model.global_stage is None
    with pytest.raises(
        ModelConfigError, match=r'global_attn_engine: expected one of .* or "None" \(or null\), found \'none\''
    ):
        ModelConfig.from_dict({**arch, "global_attn_engine": "none"})


# ----------------------------------------------------------------------------- every combination
@pytest.mark.parametrize("attn_type", ["multihead", "performer"])
@pytest.mark.parametrize("encoder_name", MIXING_ENCODERS)
def test_every_encoder_with_gps_builds_and_is_invariant(encoder_name, attn_type):
    """Builds, uses the mixers, gives energy + forces, invariant energy / equivariant forces."""
    arch = small_arch(encoder_name, global_attn_engine="GPS", global_attn_type=attn_type, global_attn_heads=2)
    torch.manual_seed(0)
    model = build_model(arch, CLUSTER_SCHEMA).eval()
    assert len(model.encoder.mixers) == arch["num_conv_layers"]
    assert all(isinstance(m, GPSLayer) for m in model.encoder.mixers)
    batch = collate(cluster_samples(CUTOFF)[:2])
    out = model(batch)
    assert out["energy"].shape == (2, 1) and out["forces"].shape == (batch.num_nodes, 3)
    assert torch.isfinite(out["forces"]).all()
    rot = random_rotation(3)
    moved = batch.clone()
    moved.pos = batch.pos @ rot.T + torch.tensor([0.5, -1.0, 2.0])
    rotated = model(moved)
    torch.testing.assert_close(rotated["energy"], out["energy"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rotated["forces"], out["forces"] @ rot.T, rtol=1e-4, atol=1e-5)
    mixers, model.encoder.mixers = model.encoder.mixers, None
    plain = model(batch)
    model.encoder.mixers = mixers
    assert not torch.allclose(plain["energy"], out["energy"]), f"{encoder_name} never calls its GPS mixers"


# ----------------------------------------------------------------------------- attention modules
def _graphs(sizes=(5, 3, 6), hidden=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(sum(sizes), hidden, generator=g)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return h, batch, list(sizes)


@pytest.mark.parametrize("cls", [MultiheadAttention, PerformerAttention])
def test_attention_never_mixes_graphs(cls):
    torch.manual_seed(0)
    attn = cls(16, 4) if cls is MultiheadAttention else cls(16, 4, 32)
    h, batch, sizes = _graphs()
    h.requires_grad_(True)
    out = attn(h, batch, len(sizes))
    start = 0
    for size in sizes:
        alone = attn(h[start : start + size].detach(), torch.zeros(size, dtype=torch.long), 1)
        torch.testing.assert_close(out[start : start + size], alone, rtol=1e-5, atol=1e-6)
        start += size
    (grad,) = torch.autograd.grad(out[:5].sum(), h)  # nodes of graph 0 depend on graph 0 only
    assert grad[:5].abs().sum() > 0 and torch.all(grad[5:] == 0)


def _exact_vs_performer(num_features: int, seeds=range(6)) -> float:
    """Mean relative error of performer attention against exact softmax attention (same weights)."""
    torch.manual_seed(0)
    exact = MultiheadAttention(16, 2)
    with torch.no_grad():  # small logits: the regime where the random-feature estimator is accurate
        exact.qkv.weight.mul_(0.3)
    h, batch, sizes = _graphs(sizes=(12, 9), seed=1)
    ref = exact(h, batch, len(sizes)).detach()
    errors = []
    for seed in seeds:
        torch.manual_seed(100 + seed)
        perf = PerformerAttention(16, 2, num_features)
        perf.qkv.load_state_dict(exact.qkv.state_dict())
        perf.out.load_state_dict(exact.out.state_dict())
        out = perf(h, batch, len(sizes)).detach()
        errors.append(float((out - ref).norm() / ref.norm()))
    return sum(errors) / len(errors)


def test_performer_approximates_softmax_attention():
    few, many = _exact_vs_performer(4), _exact_vs_performer(512)
    assert many < 0.05, f"performer with 512 features is off by {many:.3f}"
    assert many < 0.5 * few, f"error does not shrink with more features ({few:.4f} -> {many:.4f})"


# ----------------------------------------------------------------------------- redraw
def test_redraw_projections_is_deterministic_and_counts_performers(tmp_path):
    model = build("PAINN+GPS-performer", seed=1)
    performers = [m for m in model.modules() if isinstance(m, PerformerAttention)]
    assert len(performers) == 2
    before = [p.projection.clone() for p in performers]
    assert redraw_projections(model, seed=7, count=1) == 2
    first = [p.projection.clone() for p in performers]
    assert all(not torch.equal(a, b) for a, b in zip(before, first))
    assert not torch.equal(first[0], first[1]), "layers should get different projections"
    other = build("PAINN+GPS-performer", seed=2)  # another process / rank, other initial weights
    redraw_projections(other, seed=7, count=1)
    for a, b in zip(first, [m.projection for m in other.modules() if isinstance(m, PerformerAttention)]):
        assert torch.equal(a, b)
    redraw_projections(model, seed=7, count=2)
    assert not torch.equal(performers[0].projection, first[0])
    # the projection is part of the artifact
    batch = collate(periodic_samples(CUTOFF)[:2])
    loaded = load_artifact(save_artifact(model, tmp_path / "perf.hydra"))
    assert any(k.endswith("projection") for k in model.state_dict())
    assert torch.equal(model(batch)["energy"], loaded(batch)["energy"])
    assert redraw_projections(build("SchNet+GPS-multihead"), seed=7, count=1) == 0


def test_orthogonal_projection_rows_are_orthogonal_within_blocks():
    from hydragnn.models.attention import orthogonal_gaussian

    w = orthogonal_gaussian(10, 4, torch.Generator().manual_seed(0))
    assert w.shape == (10, 4)
    for block in (w[:4], w[4:8]):
        gram = block @ block.T
        torch.testing.assert_close(
            gram - torch.diag(torch.diagonal(gram)), torch.zeros(4, 4, dtype=w.dtype), atol=1e-10, rtol=0
        )


# ----------------------------------------------------------------------------- positional encodings
PE_DIM = 3


def _with_pe(samples):
    return [add_positional_encodings(s, PE_DIM) for s in samples]


def test_positional_encodings_flow_into_the_model():
    arch = small_arch("SchNet+GPS-multihead", pe_dim=PE_DIM)
    torch.manual_seed(0)
    model = build_model(arch, CLUSTER_SCHEMA).eval()
    samples = _with_pe(cluster_samples(CUTOFF))
    batch = collate(samples)
    out = model(batch)
    singles = [model(collate([s])) for s in samples]
    torch.testing.assert_close(out["energy"], torch.cat([s["energy"] for s in singles]), rtol=1e-5, atol=1e-6)
    moved = batch.clone()
    moved.lap_pe = batch.lap_pe * 0.5
    assert not torch.allclose(model(moved)["energy"], out["energy"]), "lap_pe does not reach the model"
    with pytest.raises(ModelError, match="lap_pe"):
        model(collate(cluster_samples(CUTOFF)))
    # padding by a sink graph keeps the encodings (zero rows for the sink) and the real outputs
    padded = pad_with_sink(batch, extra_nodes=3, extra_edges=7)
    assert padded.lap_pe.shape[0] == batch.num_nodes + 3 and not padded.lap_pe[-3:].any()
    pad_out = model(padded)
    torch.testing.assert_close(pad_out["energy"][: batch.num_graphs], out["energy"], rtol=1e-5, atol=1e-6)


def test_laplacian_signs_are_flipped_per_graph_in_training_only():
    torch.manual_seed(0)
    layer = GPSLayer(8, 2, "multihead", 8, PE_DIM, "silu")
    with torch.no_grad():  # make the projection the identity on pe
        layer.pe_proj.weight.zero_()
        layer.pe_proj.bias.zero_()
        layer.pe_proj.weight[: 2 * PE_DIM, : 2 * PE_DIM] = torch.eye(2 * PE_DIM)
    batch = torch.tensor([0, 0, 0, 1, 1])
    pe = torch.rand(5, 2 * PE_DIM) + 0.5
    inputs = GraphInputs(
        x=torch.zeros(5, 1),
        pos=None,
        edge_index=torch.zeros(2, 0, dtype=torch.long),
        edge_vec=None,
        edge_len=None,
        edge_attr=None,
        batch=batch,
        num_graphs=2,
        pe=pe,
    )
    h = torch.zeros(5, 8)
    layer.eval()
    torch.testing.assert_close(layer._positional(inputs, h)[:, : 2 * PE_DIM], pe)
    layer.train()
    seen = set()
    for _ in range(20):
        got = layer._positional(inputs, h)[:, : 2 * PE_DIM]
        torch.testing.assert_close(got[:, PE_DIM:], pe[:, PE_DIM:])  # random-walk part untouched
        ratio = got[:, :PE_DIM] / pe[:, :PE_DIM]
        assert torch.all(ratio.abs() == 1)
        for graph in (0, 1):  # one sign per graph and eigenvector
            rows = ratio[batch == graph]
            assert torch.all(rows == rows[0])
            seen.update(rows[0].tolist())
    assert seen == {1.0, -1.0}
