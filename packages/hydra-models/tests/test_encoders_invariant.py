"""Encoder-level tests of the invariant encoders: GIN, GAT, SAGE, MFC, CGCNN, PNA, PNAPlus.

Small random float64 graphs with brute-force edges within the radius; checks of invariance,
forces against finite differences, sink-node padding, bf16, conv checkpointing, continuity at
the cutoff (for the encoders with smooth aggregation) and config handling.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hydragnn.data.neighbors import brute_force_radius_graph
from hydragnn.models.encoders import cgcnn, gat, gin, mfc, pna, pnaplus, sage  # noqa: F401  (register)
from hydragnn.models.encoders.base import ENCODERS, EncoderConfig, EncoderDims, GraphInputs
from hydragnn.models.errors import ModelConfigError

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


def random_rotation(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


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
def test_invariance_rotation_translation_permutation(name, system):
    x, pos, edge_index, batch, b = system
    enc = build(name)
    ref = enc(make_inputs(x, pos, edge_index, batch, b)).scalar

    rot = random_rotation(7)
    moved = pos @ rot.T + torch.tensor([0.3, -1.2, 2.5], dtype=torch.float64)
    out = enc(make_inputs(x, moved, edge_index, batch, b)).scalar
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)

    # permute nodes within the batch (graph membership goes with the node) and shuffle edges
    gen = torch.Generator().manual_seed(3)
    perm = torch.randperm(x.shape[0], generator=gen)  # new node k is old node perm[k]
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    edge_perm = torch.randperm(edge_index.shape[1], generator=gen)
    new_edges = inverse[edge_index][:, edge_perm]
    out = enc(make_inputs(x[perm], pos[perm], new_edges, batch[perm], b)).scalar
    torch.testing.assert_close(out, ref[perm], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_forces_match_finite_differences(name, system):
    x, pos, edge_index, batch, b = system
    enc = build(name)
    pos = pos.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(energy(enc, make_inputs(x, pos, edge_index, batch, b)), pos)
    assert grad.abs().max() > 1e-3, "energy does not depend on positions"
    # central differences for every coordinate, all displaced copies in one batched forward
    step = 1e-5
    n, m = pos.shape[0], 2 * pos.numel()
    shifts = torch.zeros(m, n, 3, dtype=pos.dtype)
    shifts.view(m, -1)[torch.arange(0, m, 2), torch.arange(m // 2)] = step
    shifts.view(m, -1)[torch.arange(1, m, 2), torch.arange(m // 2)] = -step
    copies = (pos.detach()[None] + shifts).reshape(-1, 3)
    offsets = (torch.arange(m) * n).repeat_interleave(edge_index.shape[1])
    edges = edge_index.repeat(1, m) + offsets
    graph = torch.arange(m).repeat_interleave(n)
    with torch.no_grad():
        out = enc(make_inputs(x.repeat(m, 1), copies, edges, graph, m)).scalar.sum(dim=1)
    per_copy = torch.zeros(m, dtype=out.dtype).index_add_(0, graph, out)
    numeric = ((per_copy[0::2] - per_copy[1::2]) / (2 * step)).view(n, 3)
    torch.testing.assert_close(grad, numeric, atol=1e-6, rtol=1e-5)


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
def test_sink_node_padding(name, system):
    x, pos, edge_index, batch, b = system
    n = x.shape[0]
    enc = build(name)
    ref = enc(make_inputs(x, pos, edge_index, batch, b)).scalar

    # one sink node (atomic number 0) in its own graph, two zero-length sink -> sink edges
    x_pad = torch.cat([x, torch.zeros(1, 1, dtype=x.dtype)])
    pos_pad = torch.cat([pos, torch.zeros(1, 3, dtype=pos.dtype)]).requires_grad_(True)
    batch_pad = torch.cat([batch, torch.tensor([b])])
    sink_edges = torch.full((2, 2), n, dtype=torch.long)
    edges_pad = torch.cat([edge_index, sink_edges], dim=1)
    out = enc(make_inputs(x_pad, pos_pad, edges_pad, batch_pad, b + 1)).scalar
    torch.testing.assert_close(out[:n], ref, atol=1e-12, rtol=1e-12)
    assert torch.isfinite(out).all()

    enc.zero_grad()
    out.sum().backward()  # through the sink outputs too: no NaN from the zero-length edges
    assert torch.isfinite(pos_pad.grad).all()
    assert pos_pad.grad[n].abs().max() == 0
    for p in enc.parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_forward(name, system):
    x, pos, edge_index, batch, b = system
    enc = build(name).to(torch.bfloat16)
    inputs = make_inputs(x.bfloat16(), pos.bfloat16(), edge_index, batch, b)
    out = enc(inputs).scalar
    assert out.dtype == torch.bfloat16
    assert out.shape == (x.shape[0], 16)
    assert torch.isfinite(out.float()).all()
    ref = build(name).float()(make_inputs(x.float(), pos.float(), edge_index, batch, b)).scalar.detach()
    assert float((out.detach().float() - ref).norm() / ref.norm()) < 0.05
    # float32 inputs to a bf16 module: the encoder casts to its own dtype
    out = enc(make_inputs(x.float(), pos.float(), edge_index, batch, b)).scalar
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


class HostSyncRecorder(TorchDispatchMode):
    """Records ops that sync with the host or have data-dependent output shapes."""

    FORBIDDEN = {
        "aten._local_scalar_dense",  # .item(), int(tensor), Python branching on a tensor
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.bincount",
        "aten.repeat_interleave",
    }

    def __init__(self):
        super().__init__()
        self.bad: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if name in self.FORBIDDEN:
            self.bad.append(name)
        if name == "aten.index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
        ):
            self.bad.append("boolean-mask indexing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", NAMES)
def test_capture_safe_forward_and_backward(name, system):
    """No host sync nor data-dependent shape in forward, forces or the force-loss backward."""
    x, pos, edge_index, batch, b = system
    enc = build(name, make_dims(conv_checkpointing=True))
    p = pos.clone().requires_grad_(True)
    inputs = make_inputs(x, p, edge_index, batch, b)
    recorder = HostSyncRecorder()
    with recorder:
        e = energy(enc, inputs)
        (forces,) = torch.autograd.grad(e, p, create_graph=True)
        forces.pow(2).sum().backward()
    assert recorder.bad == []


@pytest.mark.parametrize("name", NAMES)
def test_conv_checkpointing_same_outputs_and_gradients(name, system):
    x, pos, edge_index, batch, b = system
    plain = build(name)
    ckpt = build(name, make_dims(conv_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    results = []
    for enc in (plain, ckpt):
        p = pos.clone().requires_grad_(True)
        out = enc(make_inputs(x, p, edge_index, batch, b)).scalar
        params = [q for q in enc.parameters() if q.requires_grad]
        grads = torch.autograd.grad(out.sum(), [p, *params], allow_unused=True)
        results.append((out.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], atol=0, rtol=0)
    for g0, g1 in zip(results[0][1], results[1][1]):
        if g0 is None:
            assert g1 is None
        else:
            torch.testing.assert_close(g0, g1, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", SMOOTH)
def test_continuous_when_a_neighbour_crosses_the_cutoff(name):
    """A neighbour just inside the radius contributes (almost) nothing: same as no edge."""
    gen = torch.Generator().manual_seed(5)
    pos = torch.rand(5, 3, generator=gen, dtype=torch.float64) * 1.5
    far = pos[0] + torch.tensor([RADIUS - 1e-4, 0.0, 0.0], dtype=torch.float64)
    pos = torch.cat([pos, far[None]])
    x = torch.randint(1, 10, (6, 1), generator=gen).double()
    batch = torch.zeros(6, dtype=torch.long)
    edges = brute_force_edges(pos, batch, RADIUS)
    is_crossing = ((edges[0] == 5) & (edges[1] == 0)) | ((edges[0] == 0) & (edges[1] == 5))
    assert int(is_crossing.sum()) == 2
    enc = build(name)
    with_edge = enc(make_inputs(x, pos, edges, batch, 1)).scalar
    without = enc(make_inputs(x, pos, edges[:, ~is_crossing], batch, 1)).scalar
    torch.testing.assert_close(with_edge, without, atol=1e-6, rtol=0)


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
