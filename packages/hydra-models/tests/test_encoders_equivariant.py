"""Encoder-level tests of the equivariant encoders PAINN, EGNN and PNAEq.

Small random float64 graphs with brute-force edges: rotation and reflection parity of every
configuration, and for the non-default configurations (the conformance suite covers the
defaults) forces against finite differences, sink-node padding, bf16 and checkpointing; edge
inputs, configs, symmetric structures and capture-safety (dynamo full-graph trace).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hydragnn.models.encoders.egnn  # noqa: F401  (registers EGNN)
import hydragnn.models.encoders.painn  # noqa: F401  (registers PAINN)
import hydragnn.models.encoders.pnaeq  # noqa: F401  (registers PNAEq)
from hydragnn.models.encoders.base import ENCODERS, EncoderDims, GraphInputs, get_encoder
from hydragnn.models.errors import ModelConfigError, ModelError

RADIUS = 3.0

# (registry name, config overrides)
CASES = [
    ("PAINN", {}),
    ("PAINN", {"num_vector_channels": 5}),
    ("PAINN", {"radial_mlp": 6}),
    ("PAINN", {"avg_num_neighbors": 4.0}),
    ("EGNN", {}),
    ("EGNN", {"update_coords": False, "attention": True, "num_vector_channels": 4}),
    ("PNAEq", {}),
    (
        "PNAEq",
        {
            "aggregators": ["sum", "max", "min", "std"],
            "scalers": ["identity", "attenuation"],
            "num_vector_channels": 3,
            "smooth_minmax": False,
        },
    ),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CASES)]
# The default configurations get finite differences, padding, bf16 and checkpointing from the
# conformance suite (tests/test_conformance.py); here only the non-default ones.
OTHER_CASES = [case for case in CASES if case[1]]
OTHER_IDS = [i for i, case in zip(IDS, CASES) if case[1]]


def make_dims(**kw) -> EncoderDims:
    base = dict(
        node_in=1,
        edge_in=0,
        graph_in=0,
        hidden_dim=16,
        num_conv_layers=2,
        radius=RADIUS,
        max_neighbours=None,
        num_radial=8,
        num_species=12,
    )
    base.update(kw)
    return EncoderDims(**base)


def build(name: str, overrides: dict, seed: int = 0, dtype=torch.float64, **dims_kw):
    cls = get_encoder(name)
    torch.manual_seed(seed)
    model = cls(make_dims(**dims_kw), cls.Config.from_dict(overrides))
    return model.to(dtype)


def brute_edges(pos: torch.Tensor, batch: torch.Tensor, radius: float = RADIUS) -> torch.Tensor:
    """All pairs i != j of one graph closer than ``radius``: ``[2, E]`` with row 0 = source j."""
    dist = torch.cdist(pos, pos)
    same = batch[:, None] == batch[None, :]
    eye = torch.eye(len(pos), dtype=torch.bool)
    dst, src = torch.nonzero((dist < radius) & same & ~eye, as_tuple=True)
    return torch.stack([src, dst])


def safe_len(vec: torch.Tensor) -> torch.Tensor:
    sq = (vec * vec).sum(-1)
    nz = sq > 0
    return torch.where(nz, torch.where(nz, sq, torch.ones_like(sq)).sqrt(), torch.zeros_like(sq))


def make_inputs(x, pos, batch, edge_index, num_graphs, edge_attr=None) -> GraphInputs:
    vec = pos[edge_index[0]] - pos[edge_index[1]]
    return GraphInputs(
        x=x,
        pos=pos,
        edge_index=edge_index,
        edge_vec=vec,
        edge_len=safe_len(vec),
        edge_attr=edge_attr,
        batch=batch,
        num_graphs=num_graphs,
    )


def random_system(seed: int = 0, sizes=(6, 5), dtype=torch.float64):
    """Two random molecules-like graphs: ``x [N,1]`` (atomic numbers), ``pos [N,3]``, ``batch [N]``."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    pos = torch.rand(n, 3, generator=g, dtype=dtype) * 3.0
    x = torch.randint(1, 10, (n, 1), generator=g).to(dtype)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, pos, batch


def random_orthogonal(seed: int, proper: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if (torch.det(q) < 0) == proper:
        q[:, 0] = -q[:, 0]
    return q


def run(model, x, pos, batch, num_graphs=2):
    ei = brute_edges(pos, batch)
    return model(make_inputs(x, pos, batch, ei, num_graphs)), ei


@pytest.mark.parametrize("proper", [True, False], ids=["rotation", "reflection"])
@pytest.mark.parametrize("name,overrides", CASES, ids=IDS)
def test_invariance_equivariance(name, overrides, proper):
    model = build(name, overrides)
    x, pos, batch = random_system(1)
    out, _ = run(model, x, pos, batch)
    assert out.vector is not None and out.vector.shape[:2] == (len(pos), 3)
    assert out.scalar.shape == (len(pos), 16)
    assert float(out.vector.detach().abs().max()) > 1e-6  # not trivially zero

    rot = random_orthogonal(7, proper)
    perm = torch.randperm(len(pos), generator=torch.Generator().manual_seed(3))
    shift = torch.tensor([1.5, -2.0, 0.7], dtype=torch.float64)
    pos2 = pos[perm] @ rot.T + shift
    out2, _ = run(model, x[perm], pos2, batch[perm])

    torch.testing.assert_close(out2.scalar, out.scalar[perm], rtol=1e-9, atol=1e-10)
    expected = torch.einsum("ij,njc->nic", rot, out.vector[perm])
    torch.testing.assert_close(out2.vector, expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name,overrides", OTHER_CASES, ids=OTHER_IDS)
def test_forces_match_finite_differences(name, overrides):
    model = build(name, overrides)
    x, pos, batch = random_system(2, sizes=(5, 4))
    ei = brute_edges(pos, batch)
    weights = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def energy(p):
        out = model(make_inputs(x, p, batch, ei, 2))
        return (out.scalar * weights).sum() + out.vector.pow(2).sum()

    p = pos.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(energy(p), p)
    h = 1e-5
    atoms = [0, 3, 5, 8]  # both graphs; every coordinate of these atoms
    fd = torch.zeros(len(atoms), 3, dtype=pos.dtype)
    with torch.no_grad():
        for a, i in enumerate(atoms):
            for k in range(3):
                dp = torch.zeros_like(pos)
                dp[i, k] = h
                fd[a, k] = (energy(pos + dp) - energy(pos - dp)) / (2 * h)
    torch.testing.assert_close(grad[atoms], fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,overrides", OTHER_CASES, ids=OTHER_IDS)
def test_sink_padding_leaves_real_nodes_unchanged(name, overrides):
    model = build(name, overrides)
    x, pos, batch = random_system(3)
    ei = brute_edges(pos, batch)
    n = len(pos)

    p = pos.clone().requires_grad_(True)
    out = model(make_inputs(x, p, batch, ei, 2))
    (grad,) = torch.autograd.grad(out.scalar.sum() + out.vector.pow(2).sum(), p)

    # one sink node (atomic number 0) in a third graph, four zero-length sink -> sink edges
    x_pad = torch.cat([x, torch.zeros(1, 1, dtype=x.dtype)])
    pos_pad = torch.cat([pos, torch.zeros(1, 3, dtype=pos.dtype)]).requires_grad_(True)
    batch_pad = torch.cat([batch, torch.tensor([2])])
    sink = torch.full((2, 4), n, dtype=torch.long)
    ei_pad = torch.cat([ei, sink], dim=1)
    out_pad = model(make_inputs(x_pad, pos_pad, batch_pad, ei_pad, 3))
    total = out_pad.scalar.sum() + out_pad.vector.pow(2).sum()
    (grad_pad,) = torch.autograd.grad(total, pos_pad)

    assert torch.isfinite(out_pad.scalar).all() and torch.isfinite(out_pad.vector).all()
    assert torch.isfinite(grad_pad).all()
    torch.testing.assert_close(out_pad.scalar[:n], out.scalar, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_pad.vector[:n], out.vector, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_pad[:n], grad, rtol=1e-12, atol=1e-12)

    # force training through the padded batch (double backward) keeps parameter gradients finite
    model.zero_grad()
    out_pad = model(make_inputs(x_pad, pos_pad, batch_pad, ei_pad, 3))
    energy = out_pad.scalar.sum() + out_pad.vector.pow(2).sum()
    (forces,) = torch.autograd.grad(energy, pos_pad, create_graph=True)
    (energy + forces.pow(2).sum()).backward()
    grads = [q.grad for q in model.parameters() if q.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name,overrides", OTHER_CASES, ids=OTHER_IDS)
def test_bfloat16_forward_and_backward(name, overrides):
    ref = build(name, overrides, dtype=torch.float32)
    model = build(name, overrides, dtype=torch.bfloat16)
    x, pos, batch = random_system(4, dtype=torch.float32)
    with torch.no_grad():
        out32, ei = run(ref, x, pos, batch)
    pb = pos.to(torch.bfloat16).requires_grad_(True)
    out = model(make_inputs(x.to(torch.bfloat16), pb, batch, ei, 2))
    assert out.scalar.dtype == torch.bfloat16 and out.vector.dtype == torch.bfloat16
    assert torch.isfinite(out.scalar).all() and torch.isfinite(out.vector).all()
    scale = out32.scalar.abs().max()
    assert float((out.scalar.detach().float() - out32.scalar).abs().max()) < 0.1 * float(scale) + 0.05
    (out.scalar.sum() + out.vector.float().pow(2).sum()).backward()
    assert pb.grad is not None and torch.isfinite(pb.grad).all()


@pytest.mark.parametrize("name,overrides", OTHER_CASES, ids=OTHER_IDS)
def test_checkpointing_matches(name, overrides):
    plain = build(name, overrides)
    ckpt = build(name, overrides, seed=1, conv_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    x, pos, batch = random_system(5)
    ei = brute_edges(pos, batch)

    def forces_loss(model):
        p = pos.clone().requires_grad_(True)
        out = model(make_inputs(x, p, batch, ei, 2))
        energy = out.scalar.sum() + out.vector.pow(2).sum()
        (g,) = torch.autograd.grad(energy, p, create_graph=True)
        model.zero_grad()
        (energy + g.pow(2).sum()).backward()  # double backward, as in force training
        return out, g.detach(), {k: q.grad.clone() for k, q in model.named_parameters() if q.grad is not None}

    out_a, g_a, pg_a = forces_loss(plain)
    out_b, g_b, pg_b = forces_loss(ckpt)
    torch.testing.assert_close(out_b.scalar, out_a.scalar, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_b.vector, out_a.vector, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_b, g_a, rtol=1e-10, atol=1e-12)
    assert pg_a.keys() == pg_b.keys() and len(pg_a) > 0
    for key in pg_a:
        torch.testing.assert_close(pg_b[key], pg_a[key], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["PAINN", "EGNN", "PNAEq"])
def test_edge_attr_and_linear_embedding(name):
    """Without species the node features go through a linear layer; schema edge inputs are used."""
    model = build(name, {}, num_species=0, node_in=2, edge_in=2)
    x, pos, batch = random_system(7)
    x = torch.cat([x, torch.rand_like(x)], dim=1)
    ei = brute_edges(pos, batch)
    edge_attr = torch.rand(ei.shape[1], 2, dtype=torch.float64)
    out = model(make_inputs(x, pos, batch, ei, 2, edge_attr=edge_attr))
    out2 = model(make_inputs(x, pos, batch, ei, 2, edge_attr=edge_attr * 2))
    assert torch.isfinite(out.scalar).all()
    assert not torch.allclose(out.scalar, out2.scalar)
    with pytest.raises(ModelError, match="edge_attr"):
        model(make_inputs(x, pos, batch, ei, 2))


@pytest.mark.parametrize("name", ["PAINN", "EGNN", "PNAEq"])
def test_registry_and_config(name):
    cls = ENCODERS[name]
    assert cls.equivariant and cls.needs_pos
    defaults = cls.Config()
    assert cls.Config.from_dict(dataclasses.asdict(defaults)) == defaults
    with pytest.raises(ModelConfigError, match="NeuralNetwork.Architecture"):
        cls.Config.from_dict({"no_such_key": 1})
    with pytest.raises(ModelConfigError, match="num_vector_channels"):
        cls.Config.from_dict({"num_vector_channels": 0})
    with pytest.raises(ModelConfigError, match="num_vector_channels"):
        cls.Config.from_dict({"num_vector_channels": "many"})
    with pytest.raises(ModelError, match="positions"):
        model = build(name, {})
        x, pos, batch = random_system(8)
        inputs = make_inputs(x, pos, batch, brute_edges(pos, batch), 2)
        model(dataclasses.replace(inputs, pos=None, edge_vec=None, edge_len=None))


def test_pnaeq_config_validation():
    cls = ENCODERS["PNAEq"]
    cfg = cls.Config.from_dict({"aggregators": ["mean", "max"], "avg_deg_log": 2})
    assert cfg.aggregators == ("mean", "max") and cfg.avg_deg_log == 2.0
    for bad in ({"aggregators": ["median"]}, {"scalers": []}, {"aggregators": ["max", "max"]}, {"avg_deg_lin": 0.0}):
        with pytest.raises(ModelConfigError, match="NeuralNetwork.Architecture"):
            cls.Config.from_dict(bad)


def test_pnaeq_energy_continuous_at_cutoff():
    """A neighbour crossing the radius changes nothing: its messages and degree weight vanish."""
    model = build("PNAEq", {"aggregators": ["mean", "min", "max", "std", "sum"]})
    x, pos, batch = random_system(9, sizes=(5,))
    far = torch.tensor([[0.0, 0.0, 0.0], [RADIUS - 1e-9, 0.0, 0.0]], dtype=torch.float64)
    pos_in = torch.cat([pos + 50.0, far])  # an isolated pair at the cutoff, plus a molecule far away
    x_in = torch.cat([x, torch.tensor([[3.0], [5.0]], dtype=torch.float64)])
    b = torch.zeros(len(pos_in), dtype=torch.long)
    ei_all = brute_edges(pos_in, b)
    ei_cut = ei_all[:, ei_all.max(dim=0).values < len(pos)]  # drop the pair's edges
    with_edge = model(make_inputs(x_in, pos_in, b, ei_all, 1))
    without = model(make_inputs(x_in, pos_in, b, ei_cut, 1))
    assert ei_all.shape[1] == ei_cut.shape[1] + 2
    torch.testing.assert_close(with_edge.scalar, without.scalar, rtol=0, atol=1e-8)


@pytest.mark.parametrize("name", ["PAINN", "EGNN", "PNAEq"])
def test_forces_at_symmetric_configuration(name, overrides=None):
    """At a symmetric site neighbours give exactly tied messages, zero vectors and zero variance
    (as in crystals): soft min/max and the eps in norms / std keep the energy smooth there."""
    model = build(name, overrides or {})
    octahedron = torch.tensor(
        [[0, 0, 0], [1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], dtype=torch.float64
    )
    pos = octahedron * 1.4
    x = torch.tensor([[8.0]] + [[1.0]] * 6, dtype=torch.float64)
    batch = torch.zeros(7, dtype=torch.long)
    ei = brute_edges(pos, batch)
    direction = torch.randn(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    direction = direction / direction.norm()

    def energy(p):
        return model(make_inputs(x, p, batch, ei, 1)).scalar.sum()

    p = pos.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(energy(p), p)
    h = 1e-4
    with torch.no_grad():  # directional derivatives along the axes and a random direction
        for d in [torch.eye(21, dtype=torch.float64)[k].reshape(7, 3) for k in (0, 3, 5, 10)] + [direction]:
            fd = (energy(pos + h * d) - energy(pos - h * d)) / (2 * h)
            torch.testing.assert_close((grad * d).sum(), fd, rtol=1e-6, atol=1e-8)


def test_pnaeq_soft_extreme_limits():
    from hydragnn.models.encoders.pnaeq import soft_extreme

    msg = torch.tensor([[1.0, -2.0], [3.0, -1.0], [2.0, -5.0], [0.5, 0.5]], dtype=torch.float64)
    index = torch.tensor([0, 0, 0, 2])  # node 1 has no neighbours
    weight = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)  # node 2's only edge sits at the cutoff
    hard_max = soft_extreme(msg, weight, index, 3, 200.0)
    hard_min = soft_extreme(msg, weight, index, 3, -200.0)
    torch.testing.assert_close(
        hard_max, torch.tensor([[3.0, 0.0], [0, 0], [0, 0]], dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        hard_min, torch.tensor([[0.0, -5.0], [0, 0], [0, 0]], dtype=torch.float64), atol=1e-6, rtol=0
    )
    big = msg.clone().requires_grad_(True)
    out = soft_extreme(big * 1e3, weight, index, 3, 2.0)  # no overflow for large messages
    (g,) = torch.autograd.grad(out.sum(), big)
    assert torch.isfinite(out).all() and torch.isfinite(g).all()


@pytest.mark.parametrize("name", ["PAINN", "EGNN", "PNAEq"])
def test_capture_safe_full_graph_trace(name):
    """Dynamo traces forward + forces without a graph break (no host sync, no dynamic shapes)."""
    model = build(name, {}, dtype=torch.float32)
    x, pos, batch = random_system(10, dtype=torch.float32)
    ei = brute_edges(pos, batch)

    def energy_and_forces(x, p, batch, ei):
        out = model(make_inputs(x, p, batch, ei, 2))
        energy = out.scalar.sum() + out.vector.pow(2).sum()
        (grad,) = torch.autograd.grad(energy, p)
        return energy.detach(), -grad

    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(energy_and_forces, backend="eager", fullgraph=True)
        e_c, f_c = compiled(x, pos.clone().requires_grad_(True), batch, ei)
    e, f = energy_and_forces(x, pos.clone().requires_grad_(True), batch, ei)
    torch.testing.assert_close(e_c, e)
    torch.testing.assert_close(f_c, f)


def test_egnn_builds_and_computes_vectors_only_where_they_are_read():
    """Without ``update_coords`` and without a stage that reads vectors (only the
    EquivariantTransformer does), EGNN has no coordinate MLP and returns no vectors; its
    artifacts written while it had one still load, with the same outputs."""
    from hydragnn.models.testing import CUTOFF
    from hydragnn.models.testing import build as build_model
    from hydragnn.models.testing.graphs import collate, periodic_samples

    batch = collate(periodic_samples(CUTOFF)[:2])

    def encode(model):
        return model.encode(model.graph_inputs(batch, batch.pos, batch.edge_index, batch.edge_shift))

    plain = build_model("EGNN", update_coords=False)
    assert plain.encoder.vector_channels == 0 and not any(".coord_mlp." in k for k in plain.state_dict())
    emb = encode(plain)
    assert emb.vector is None and torch.isfinite(emb.scalar).all()
    staged = build_model("EGNN", update_coords=False, global_attn_engine="EquivariantTransformer", global_attn_heads=4)
    assert staged.global_stage.vector_in is not None and any(".coord_mlp." in k for k in staged.state_dict())
    assert encode(staged).vector is not None
    moving = build_model("EGNN")  # update_coords: the vectors feed the next layer's distances
    assert encode(moving).vector is not None

    older = dict(plain.state_dict())
    older.update({k: v for k, v in staged.state_dict().items() if ".coord_mlp." in k and k.startswith("encoder.")})
    again = build_model("EGNN", update_coords=False, seed=1)
    again.load_state_dict(older)  # strict: the unread weights are skipped, nothing else
    torch.testing.assert_close(encode(again).scalar, emb.scalar, rtol=0, atol=0)
