"""Encoder-level tests of the invariant encoders: GIN, GAT, SAGE, MFC, CGCNN, PNA, PNAPlus.

Small random float64 graphs with brute-force edges within the radius. Only what is specific to
these encoders: output shapes, forces at a symmetric structure, graphs without positions or
edges, edge inputs, aggregators and scalers, GAT's attention weights, capture safety of the
force-loss backward, config handling. Invariance, finite differences, padding, precisions,
checkpointing and cutoff continuity are the conformance suite's (tests/test_conformance.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hydragnn.data.neighbors import brute_force_radius_graph
from hydragnn.models.encoders import cgcnn, gat, gin, mfc, pna, pnaplus, sage  # noqa: F401  (register)
from hydragnn.models.encoders.base import ENCODERS, EncoderConfig, EncoderDims, GraphInputs
from hydragnn.models.errors import ModelConfigError
from hydragnn.models.nn import pna as pna_nn
from hydragnn.models.testing import HostSyncDetector

NAMES = ["GIN", "GAT", "SAGE", "MFC", "CGCNN", "PNA", "PNAPlus"]
SMOOTH = NAMES  # all continuous at the cutoff (PNA since its messages are envelope-weighted)
RADIUS = 2.5


def make_dims(**changes) -> EncoderDims:
    dims = EncoderDims(
        node_in=1,
        edge_in=0,
        graph_in=0,
        hidden_dim=16,
        num_conv_layers=2,
        radius=RADIUS,
        max_neighbours=None,
        num_radial=8,
        num_species=10,
    )
    return dataclasses.replace(dims, **changes)


def build(name: str, dims: EncoderDims | None = None, seed: int = 0, **config) -> torch.nn.Module:
    cls = ENCODERS[name]
    torch.manual_seed(seed)
    return cls(dims or make_dims(), cls.Config.from_dict(config)).double()


def brute_force_edges(pos: torch.Tensor, batch: torch.Tensor, cutoff: float) -> torch.Tensor:
    """All ordered pairs j -> i (i != j) of the same graph closer than ``cutoff``: ``[2, E]``."""
    return brute_force_radius_graph(pos.detach(), cutoff, batch=batch)[0]


def make_inputs(x, pos, edge_index, batch, num_graphs, edge_attr=None) -> GraphInputs:
    vec = pos[edge_index[0]] - pos[edge_index[1]]
    length = torch.linalg.vector_norm(vec, dim=-1)  # gradient 0 (not NaN) at zero length
    return GraphInputs(
        x=x,
        pos=pos,
        edge_index=edge_index,
        edge_vec=vec,
        edge_len=length,
        edge_attr=edge_attr,
        batch=batch,
        num_graphs=num_graphs,
    )


@pytest.fixture(scope="module")
def system():
    """Two graphs (6 and 7 atoms) in float64, with atomic numbers 1..9 as x."""
    gen = torch.Generator().manual_seed(1234)
    sizes = [6, 7]
    batch = torch.cat([torch.full((s,), g, dtype=torch.long) for g, s in enumerate(sizes)])
    pos = torch.rand(sum(sizes), 3, generator=gen, dtype=torch.float64) * 3.0
    x = torch.randint(1, 10, (sum(sizes), 1), generator=gen).double()
    edge_index = brute_force_edges(pos, batch, RADIUS)
    dist = (pos[edge_index[0]] - pos[edge_index[1]]).norm(dim=-1)
    all_dist = torch.cdist(pos, pos)
    # no pair so close to the cutoff that a finite-difference step could cross it
    assert ((all_dist - RADIUS).abs() > 1e-3).all()
    assert dist.numel() > 20
    return x, pos, edge_index, batch, len(sizes)


def energy(encoder, inputs) -> torch.Tensor:
    return encoder(inputs).scalar.sum()


def test_registered_with_config():
    for name in NAMES:
        cls = ENCODERS[name]
        assert issubclass(cls.Config, EncoderConfig)
        assert cls.equivariant is False
        assert cls.Config.from_dict({}) == cls.Config()
        with pytest.raises(ModelConfigError, match="unknown key"):
            cls.Config.from_dict({"no_such_key": 1})


@pytest.mark.parametrize("name", NAMES)
def test_output_shape_and_determinism(name, system):
    x, pos, edge_index, batch, b = system
    inputs = make_inputs(x, pos, edge_index, batch, b)
    out1 = build(name)(inputs)
    out2 = build(name)(inputs)
    assert out1.scalar.shape == (x.shape[0], 16)
    assert out1.vector is None
    assert torch.equal(out1.scalar, out2.scalar)
    assert torch.isfinite(out1.scalar).all()


@pytest.mark.parametrize("name", NAMES)
def test_forces_at_a_symmetric_structure(name):
    """Exactly tied messages (an octahedron around a centre): forces still match central differences.

    A hard max/min over neighbours is not differentiable there; the default aggregators are smooth.
    """
    a = 1.3
    shell = [[a, 0, 0], [-a, 0, 0], [0, a, 0], [0, -a, 0], [0, 0, a], [0, 0, -a]]
    pos = torch.tensor([[0.0, 0.0, 0.0], *shell], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([[8.0]] + [[1.0]] * 6, dtype=torch.float64)
    batch = torch.zeros(7, dtype=torch.long)
    edges = brute_force_edges(pos.detach(), batch, RADIUS)
    enc = build(name)
    (grad,) = torch.autograd.grad(energy(enc, make_inputs(x, pos, edges, batch, 1)), pos)
    step = 1e-6
    numeric = torch.zeros_like(grad)
    with torch.no_grad():
        for i, k in [(1, 0), (1, 1), (3, 1), (5, 2), (0, 0)]:
            plus, minus = pos.detach().clone(), pos.detach().clone()
            plus[i, k] += step
            minus[i, k] -= step
            e_plus = energy(enc, make_inputs(x, plus, edges, batch, 1))
            e_minus = energy(enc, make_inputs(x, minus, edges, batch, 1))
            numeric[i, k] = (e_plus - e_minus) / (2 * step)
            assert abs(float(grad[i, k] - numeric[i, k])) < 1e-6 * max(1.0, abs(float(numeric[i, k])))


@pytest.mark.parametrize("name", NAMES)
def test_capture_safe_forward_and_backward(name, system):
    """No host sync nor data-dependent shape in forward, forces or the force-loss backward."""
    x, pos, edge_index, batch, b = system
    enc = build(name, make_dims(conv_checkpointing=True))
    p = pos.clone().requires_grad_(True)
    inputs = make_inputs(x, p, edge_index, batch, b)
    with HostSyncDetector() as detector:
        e = energy(enc, inputs)
        (forces,) = torch.autograd.grad(e, p, create_graph=True)
        forces.pow(2).sum().backward()
    assert detector.violations == []


@pytest.mark.parametrize("name", NAMES)
def test_without_positions_and_with_edge_inputs(name, system):
    x, pos, edge_index, batch, b = system
    gen = torch.Generator().manual_seed(9)
    # non-geometric graph: no pos, edge inputs only, plain linear node input (no species)
    dims = make_dims(edge_in=2, num_species=0, node_in=3)
    x3 = torch.randn(x.shape[0], 3, generator=gen, dtype=torch.float64)
    edge_attr = torch.randn(edge_index.shape[1], 2, generator=gen, dtype=torch.float64)
    enc = build(name, dims)
    inputs = GraphInputs(
        x=x3,
        pos=None,
        edge_index=edge_index,
        edge_vec=None,
        edge_len=None,
        edge_attr=edge_attr,
        batch=batch,
        num_graphs=b,
    )
    out = enc(inputs).scalar
    assert out.shape == (x.shape[0], 16) and torch.isfinite(out).all()
    # the same weights with geometry, and species embedding plus extra node columns
    dims = make_dims(edge_in=2, node_in=3)
    x3[:, 0] = x[:, 0]
    out = build(name, dims)(make_inputs(x3, pos, edge_index, batch, b, edge_attr)).scalar
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_force_loss_trains(name, system):
    """Double backward: a loss on forces = -dE/dpos has finite gradients for the weights."""
    x, pos, edge_index, batch, b = system
    enc = build(name)
    pos = pos.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(energy(enc, make_inputs(x, pos, edge_index, batch, b)), pos, create_graph=True)
    params = [p for p in enc.parameters() if p.requires_grad]
    grads = torch.autograd.grad(grad.pow(2).sum(), params, allow_unused=True)
    used = [g for g in grads if g is not None]
    assert len(used) > len(params) // 2
    assert all(torch.isfinite(g).all() for g in used)


def test_pnaplus_all_aggregators_and_scalers(system):
    x, pos, edge_index, batch, b = system
    config = dict(
        aggregators=list(pna.PNA_AGGREGATORS), scalers=list(pna.PNA_SCALERS), towers=2, pre_layers=2, post_layers=2
    )
    enc = build("PNAPlus", **config)
    p = pos.clone().requires_grad_(True)
    out = enc(make_inputs(x, p, edge_index, batch, b)).scalar
    (grad,) = torch.autograd.grad(out.sum(), p)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    ref = build("PNA", **config)(make_inputs(x, pos, edge_index, batch, b)).scalar
    assert ref.shape == out.shape


def test_pna_aggregation_matches_its_definition_node_by_node():
    """Every aggregator and scaler of the envelope-weighted aggregation (pnaplus module docstring),
    two towers, against a per-node loop; max and min also when requested together (one fused
    reduction) and alone, in either order; a node without neighbours included."""
    torch.manual_seed(3)
    n, e, towers, f = 5, 14, 2, 3
    index = torch.randint(0, n - 1, (e,))  # node n - 1 receives nothing
    m = torch.randn(e, towers, f, dtype=torch.float64)
    env = torch.rand(e, 1, dtype=torch.float64)
    avg_lin, avg_log = 2.5, 1.1
    d = torch.zeros(n, dtype=torch.float64).index_add(0, index, env[:, 0])
    big_d = torch.sqrt(1 + d * d)

    def reference(name: str, i: int) -> torch.Tensor:
        mi, wi = m[index == i], env[index == i].unsqueeze(-1)
        mean = (mi.sum(0) if len(mi) else torch.zeros(towers, f, dtype=m.dtype)) / big_d[i]
        with_zero = torch.cat([mi, torch.zeros(1, towers, f, dtype=m.dtype)])
        var = (wi * (mi - mean) ** 2).sum(0) / big_d[i]
        soft = {t: (wi * mi.mul(t).exp() * mi).sum(0) / (1 + (wi * mi.mul(t).exp()).sum(0)) for t in (1.0, -1.0)}
        return {
            "sum": mi.sum(0),
            "mean": mean,
            "max": with_zero.amax(0),
            "min": with_zero.amin(0),
            "var": var,
            "std": torch.sqrt(var + pna_nn.STD_EPS**2) - pna_nn.STD_EPS,
            "softmax": soft[1.0],
            "softmin": soft[-1.0],
        }[name]

    factor = {
        "identity": torch.ones_like(d),
        "amplification": torch.log(d + 1) / avg_log,
        "attenuation": avg_log / torch.log(big_d + 1),
        "linear": d / avg_lin,
        "inverse_linear": avg_lin / big_d,
    }
    for aggregators in (pna.PNA_AGGREGATORS, ("min", "mean", "max"), ("max",), ("min", "std")):
        conv = pna_nn.GatedPNAConv(
            4,
            aggregators,
            learned_gate=False,
            in_channels=f * towers,
            out_channels=f * towers,
            aggregators=pna_nn.pyg_aggregators(aggregators),
            scalers=list(pna.PNA_SCALERS),
            deg=torch.tensor([0, 2, 2]),
            towers=towers,
            divide_input=True,
        ).double()
        conv.aggr_module.avg_deg_lin.fill_(avg_lin)
        conv.aggr_module.avg_deg_log.fill_(avg_log)
        out = conv.aggregate(m, index, dim_size=n, env=env)
        for i in range(n):
            blocks = [reference(a, i) * factor[s][i] for s in pna.PNA_SCALERS for a in aggregators]
            torch.testing.assert_close(out[i], torch.cat(blocks, dim=-1))


@pytest.mark.parametrize("name", NAMES)
def test_graph_without_edges(name):
    """Isolated atoms (E = 0): finite outputs, zero forces."""
    x = torch.tensor([[1.0], [8.0]], dtype=torch.float64)
    pos = torch.tensor([[0.0, 0.0, 0.0], [5.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    edges = torch.zeros(2, 0, dtype=torch.long)
    out = build(name)(make_inputs(x, pos, edges, torch.tensor([0, 1]), 2)).scalar
    (grad,) = torch.autograd.grad(out.sum(), pos, allow_unused=True, materialize_grads=True)
    assert torch.isfinite(out).all() and torch.equal(grad, torch.zeros_like(grad))


def test_config_errors():
    with pytest.raises(ModelConfigError, match="activation"):
        build("GIN", activation="swishy")
    with pytest.raises(ModelConfigError, match="radial_basis"):
        build("SAGE", radial_basis="chebyshev")
    with pytest.raises(ModelConfigError, match="heads"):
        build("GAT", heads=3, concat=True)
    with pytest.raises(ModelConfigError, match="aggregators"):
        build("PNA", aggregators=["mean", "median"])
    with pytest.raises(ModelConfigError, match="pna_deg"):
        build("PNAPlus", pna_deg=[5, 0, 0])
    with pytest.raises(ModelConfigError, match="max_degree"):
        build("MFC", max_degree=0)
    with pytest.raises(ModelConfigError, match="expected int"):
        ENCODERS["GAT"].Config.from_dict({"heads": "four"})


def test_gat_concat_heads_and_pna_degree_histogram(system):
    x, pos, edge_index, batch, b = system
    inputs = make_inputs(x, pos, edge_index, batch, b)
    out = build("GAT", heads=4, concat=True)(inputs).scalar
    assert out.shape == (x.shape[0], 16)
    deg = [0, 2, 5, 9, 4, 1]
    enc = build("PNA", pna_deg=deg, aggregators=["sum", "mean"], scalers=["identity", "inverse_linear"])
    assert enc.Config is pna.PNAConfig
    assert torch.isfinite(enc(inputs).scalar).all()


def test_gat_attention_weights_count_neighbours(system):
    """Null-key attention: per node the weights sum to less than one and grow with every added neighbour."""
    x, pos, edge_index, batch, b = system
    enc = build("GAT")
    conv = enc.convs[0]
    inputs = make_inputs(x, pos, edge_index, batch, b)
    edge_feat, env = enc.edges(inputs)
    h = enc.embedding(x)
    x_l = conv.lin_l(h).view(-1, conv.heads, conv.out_channels)
    x_r = conv.lin_r(h).view(-1, conv.heads, conv.out_channels)

    def weight_sums(edges, feat, e):
        alpha = conv.edge_updater(edges, x=(x_l, x_r), edge_attr=feat, env=e)  # [E, H]
        return torch.zeros(x.shape[0], conv.heads, dtype=alpha.dtype).index_add_(0, edges[1], alpha)

    sums = weight_sums(edge_index, edge_feat, env)
    has_edges = torch.zeros(x.shape[0], dtype=torch.bool)
    has_edges[edge_index[1]] = True
    assert (sums[has_edges] > 0).all() and (sums < 1).all()
    # the same neighbours twice: every receiving node's total weight grows (a plain softmax stays at 1)
    doubled = weight_sums(edge_index.repeat(1, 2), edge_feat.repeat(2, 1), env.repeat(2, 1))
    assert (doubled[has_edges] > sums[has_edges] + 1e-6).all()
