"""Encoder-level tests of DimeNet++ and MACE on small random float64 graphs.

Edges come from a brute-force neighbour search in this file (periodic images included), so
the tests do not depend on hydra-data's neighbour lists.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from e3nn import o3

from hydragnn.models.encoders.base import ENCODERS, EncoderDims, GraphInputs
from hydragnn.models.encoders.dimenet import DimeNetConfig, DimeNetEncoder
from hydragnn.models.encoders.mace import MACEConfig, MACEEncoder
from hydragnn.models.errors import ModelConfigError
from hydragnn.models.nn.triplets import build_triplets, build_triplets_padded, max_in_degree

RADIUS = 3.0
DIMS = EncoderDims(
    node_in=1,
    edge_in=0,
    graph_in=0,
    hidden_dim=8,
    num_conv_layers=2,
    radius=RADIUS,
    max_neighbours=None,
    num_radial=4,
    num_species=10,
)
CONFIGS = {
    "dimenet": (DimeNetEncoder, DimeNetConfig(int_emb_size=8, basis_emb_size=4, out_emb_size=16, num_spherical=3)),
    "dimenet_padded": (
        DimeNetEncoder,
        DimeNetConfig(int_emb_size=8, basis_emb_size=4, out_emb_size=16, num_spherical=3, triplet_capacity=64),
    ),
    "mace": (
        MACEEncoder,
        MACEConfig(max_ell=2, node_max_ell=1, correlation=2, avg_num_neighbors=4.0, radial_mlp_dim=8),
    ),
    # correlation 3 (factorised path weights) and 2e node features
    "mace_c3": (
        MACEEncoder,
        MACEConfig(max_ell=2, node_max_ell=2, correlation=3, avg_num_neighbors=4.0, radial_mlp_dim=8),
    ),
    # mace-torch's max_L=0 (scalar node features) with per-species tables for four elements only
    "mace_l0": (
        MACEEncoder,
        MACEConfig(
            max_ell=2, node_max_ell=0, correlation=2, avg_num_neighbors=4.0, radial_mlp_dim=8, elements=(1, 3, 5, 7)
        ),
    ),
    # mace-torch's input scales, and the element-dependent residual from the first layer on
    "mace_torch_res1": (
        MACEEncoder,
        MACEConfig(
            max_ell=1,
            node_max_ell=1,
            correlation=2,
            avg_num_neighbors=4.0,
            radial_mlp_dim=8,
            scales="mace-torch",
            residual_first_layer=True,
        ),
    ),
}
BASIC = ["dimenet", "dimenet_padded", "mace"]  # the configs of the slower tests


# ----------------------------------------------------------------------------- helpers


def brute_force_edges(pos, batch, cutoff, cell=None, images=2):
    """All pairs (src j, dst i) within ``cutoff`` in the same graph; with ``cell`` [3, 3] (one
    periodic graph), every image ``n`` in ``[-images, images]^3``. Returns edge_index, shift
    (Cartesian, vec = pos[src] - pos[dst] + shift) and the integer image of each edge."""
    src_l, dst_l, img_l = [], [], []
    n = pos.shape[0]
    ranges = [range(-images, images + 1)] * 3 if cell is not None else [[0]] * 3
    for img in itertools.product(*ranges):
        shift = torch.tensor(img, dtype=pos.dtype) @ cell if cell is not None else torch.zeros(3, dtype=pos.dtype)
        for j in range(n):
            for i in range(n):
                if batch[i] != batch[j] or (i == j and img == (0, 0, 0)):
                    continue
                if torch.linalg.vector_norm(pos[j] - pos[i] + shift) < cutoff:
                    src_l.append(j)
                    dst_l.append(i)
                    img_l.append(img)
    edge_index = torch.tensor([src_l, dst_l], dtype=torch.long)
    image = torch.tensor(img_l, dtype=torch.long).reshape(-1, 3)
    shift = image.to(pos.dtype) @ cell if cell is not None else torch.zeros(len(src_l), 3, dtype=pos.dtype)
    return edge_index, shift, image


def make_inputs(pos, z, edge_index, shift, batch, num_graphs, dtype=torch.float64):
    vec = pos[edge_index[0]] - pos[edge_index[1]] + shift
    return GraphInputs(
        x=z.to(dtype).unsqueeze(-1),
        pos=pos,
        edge_index=edge_index,
        edge_vec=vec.to(dtype),
        edge_len=torch.linalg.vector_norm(vec, dim=-1).to(dtype),
        edge_attr=None,
        batch=batch,
        num_graphs=num_graphs,
    )


def molecules(seed=0):
    """Two small random molecules (5 and 4 atoms), min distance ~0.9."""
    gen = torch.Generator().manual_seed(seed)
    pos, batch = [], []
    for g, n in enumerate((5, 4)):
        pts = []
        while len(pts) < n:
            p = torch.rand(3, generator=gen, dtype=torch.float64) * 2.4
            if all(torch.linalg.vector_norm(p - q) > 0.9 for q in pts):
                pts.append(p)
        pos.append(torch.stack(pts) + 10.0 * g)
        batch += [g] * n
    pos = torch.cat(pos)
    batch = torch.tensor(batch)
    z = torch.randint(1, DIMS.num_species, (pos.shape[0],), generator=gen)
    edge_index, shift, _ = brute_force_edges(pos, batch, RADIUS)
    return pos, z, edge_index, shift, batch, 2


def crystal(seed=0):
    """Three atoms in a small triclinic periodic cell (cutoff > cell length: self-images, k == i triplets)."""
    gen = torch.Generator().manual_seed(seed)
    cell = torch.tensor([[2.3, 0.0, 0.0], [0.4, 2.4, 0.0], [0.2, 0.3, 2.5]], dtype=torch.float64)
    frac = torch.tensor([[0.1, 0.1, 0.1], [0.5, 0.55, 0.45], [0.2, 0.6, 0.8]], dtype=torch.float64)
    pos = frac @ cell + 0.05 * torch.randn(3, 3, generator=gen, dtype=torch.float64)
    batch = torch.zeros(3, dtype=torch.long)
    z = torch.tensor([3, 5, 7])
    edge_index, shift, image = brute_force_edges(pos, batch, RADIUS, cell=cell)
    return pos, z, edge_index, shift, batch, 1, cell, image


def build(name, dims=DIMS, seed=0, dtype=torch.float64):
    cls, cfg = CONFIGS[name]
    torch.manual_seed(seed)
    return cls(dims, cfg).to(dtype)


_CACHE: dict[str, torch.nn.Module] = {}


def cached(name):
    """One float64 module per config, built with seed 0 (building e3nn modules takes seconds).
    Tests must not mutate it: gradients through ``torch.autograd.grad``, never ``backward``."""
    if name not in _CACHE:
        _CACHE[name] = build(name)
    return _CACHE[name]


def brute_force_triplets(edge_index, image):
    out = []
    src, dst = edge_index.tolist()
    for ji in range(len(src)):
        for kj in range(len(src)):
            if dst[kj] != src[ji]:
                continue
            if src[kj] == dst[ji] and bool((image[kj] + image[ji] == 0).all()):
                continue  # back to the same atom, same image
            out.append((kj, ji))
    return out


# ----------------------------------------------------------------------------- triplets


def test_registry_and_config():
    assert ENCODERS["DimeNet"] is DimeNetEncoder and ENCODERS["MACE"] is MACEEncoder
    assert DimeNetEncoder.Config is DimeNetConfig and MACEEncoder.Config is MACEConfig
    assert MACEEncoder.equivariant and not DimeNetEncoder.equivariant
    assert MACEConfig.from_dict({"max_ell": 2, "avg_num_neighbors": 12}).avg_num_neighbors == 12.0
    assert DimeNetConfig.from_dict({"triplet_capacity": None, "num_spherical": 5}).num_spherical == 5
    with pytest.raises(ModelConfigError, match="max_ell"):
        MACEConfig.from_dict({"max_ell": "3"})
    with pytest.raises(ModelConfigError, match="node_max_ell"):
        MACEConfig.from_dict({"max_ell": 1, "node_max_ell": 2})
    assert MACEConfig.from_dict({"node_max_ell": 0}).node_max_ell == 0
    with pytest.raises(ModelConfigError, match="unknown"):
        DimeNetConfig.from_dict({"num_radial_typo": 3})
    with pytest.raises(ModelConfigError, match="triplet_capacity"):
        DimeNetConfig(triplet_capacity=0)


def test_triplets_match_brute_force_molecules():
    pos, z, edge_index, shift, batch, _ = molecules()
    vec = pos[edge_index[0]] - pos[edge_index[1]] + shift
    image = torch.zeros(edge_index.shape[1], 3, dtype=torch.long)
    expected = brute_force_triplets(edge_index, image)
    for ev in (None, vec):
        kj, ji = build_triplets(edge_index, pos.shape[0], ev)
        got = list(zip(kj.tolist(), ji.tolist(), strict=True))
        # torch-sparse order: by ji, then by source k
        key = [(j, edge_index[0, k].item(), k) for k, j in got]
        assert key == sorted(key)
        assert sorted(got) == sorted(expected)


def test_triplets_match_brute_force_periodic():
    pos, z, edge_index, shift, batch, _, cell, image = crystal()
    vec = pos[edge_index[0]] - pos[edge_index[1]] + shift
    expected = brute_force_triplets(edge_index, image)
    kj, ji = build_triplets(edge_index, pos.shape[0], vec)
    assert sorted(zip(kj.tolist(), ji.tolist(), strict=True)) == sorted(expected)
    # the periodic case must exercise k == i with a different image (kept) and self-image edges
    assert any(edge_index[0, k] == edge_index[1, j] for k, j in expected)
    assert bool((edge_index[0] == edge_index[1]).any())
    # padded layout: same set with weight 1 when the capacity holds every in-degree
    cap = max_in_degree(edge_index, pos.shape[0])
    pkj, pji, w = build_triplets_padded(edge_index, pos.shape[0], cap, vec)
    assert pkj.shape == (edge_index.shape[1] * cap,) and w.dtype == torch.bool
    assert sorted(zip(pkj[w].tolist(), pji[w].tolist(), strict=True)) == sorted(expected)
    # a smaller capacity keeps a subset, with the same fixed-size layout
    pkj, pji, w = build_triplets_padded(edge_index, pos.shape[0], cap - 3, vec)
    assert pkj.shape == (edge_index.shape[1] * (cap - 3),)
    assert set(zip(pkj[w].tolist(), pji[w].tolist(), strict=True)) < set(expected)


def test_triplets_exclude_zero_length_sink_edges():
    edge_index = torch.tensor([[0, 1, 2, 2, 2], [1, 0, 2, 2, 2]])  # node 2: sink with three self-loops
    vec = torch.tensor([[1.0, 0, 0], [-1.0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.float64)
    kj, ji = build_triplets(edge_index, 3, vec)
    assert kj.numel() == 0 and ji.numel() == 0
    _, _, w = build_triplets_padded(edge_index, 3, 4, vec)
    assert not bool(w.any())
    kj, ji = build_triplets(edge_index[:, :0], 3, vec[:0])
    assert kj.numel() == 0


# ----------------------------------------------------------------------------- symmetries


def _random_rotation(seed=1):
    torch.manual_seed(seed)
    return o3.rand_matrix(dtype=torch.float64)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_invariance_and_equivariance(name):
    enc = cached(name)
    pos, z, edge_index, shift, batch, ng = molecules()
    ref = enc(make_inputs(pos, z, edge_index, shift, batch, ng))
    rot = _random_rotation()
    moved = pos @ rot.T + torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    # permute nodes and edges
    perm = torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(3))
    inv = torch.argsort(perm)
    eperm = torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(4))
    out = enc(make_inputs(moved[perm], z[perm], inv[edge_index][:, eperm], shift[eperm] @ rot.T, batch[perm], ng))
    scale = float(ref.scalar.detach().abs().max())
    assert scale > 1e-3
    torch.testing.assert_close(out.scalar[inv], ref.scalar, atol=1e-6 * scale, rtol=1e-6)
    if enc.vector_channels:
        assert ref.vector.shape == (pos.shape[0], 3, DIMS.hidden_dim)
        expected = torch.einsum("ab,nbc->nac", rot, ref.vector)  # xyz components rotate with R
        torch.testing.assert_close(
            out.vector[inv], expected, atol=1e-6 * float(ref.vector.detach().abs().max()), rtol=1e-6
        )
    else:
        assert ref.vector is None


@pytest.mark.parametrize("name", ["dimenet", "mace"])
def test_periodic_rotation_invariance(name):
    enc = cached(name)
    pos, z, edge_index, shift, batch, ng, cell, _ = crystal()
    ref = enc(make_inputs(pos, z, edge_index, shift, batch, ng)).scalar
    rot = _random_rotation(5)
    out = enc(make_inputs(pos @ rot.T + 0.7, z, edge_index, shift @ rot.T, batch, ng)).scalar
    torch.testing.assert_close(out, ref, atol=1e-6 * float(ref.detach().abs().max()), rtol=1e-6)


# ----------------------------------------------------------------------------- forces


def _energy(enc, pos, z, edge_index, shift, batch, ng):
    return enc(make_inputs(pos, z, edge_index, shift, batch, ng)).scalar.sum()


@pytest.mark.parametrize(
    ("name", "system"),
    [("dimenet", "molecules"), ("dimenet_padded", "crystal"), ("mace", "molecules"), ("mace_c3", "crystal")],
)
def test_forces_match_finite_differences(name, system):
    enc = cached(name)
    data = molecules() if system == "molecules" else crystal()[:6]
    pos, z, edge_index, shift, batch, ng = data
    pos = pos.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_energy(enc, pos, z, edge_index, shift, batch, ng), pos)
    h = 1e-5
    fd = torch.zeros_like(pos)
    with torch.no_grad():
        for a in range(3):  # the first three atoms (time): every coordinate of each
            for c in range(3):
                plus, minus = pos.detach().clone(), pos.detach().clone()
                plus[a, c] += h
                minus[a, c] -= h
                fd[a, c] = (
                    _energy(enc, plus, z, edge_index, shift, batch, ng)
                    - _energy(enc, minus, z, edge_index, shift, batch, ng)
                ) / (2 * h)
    assert grad.abs().max() > 1e-4
    torch.testing.assert_close(grad[:3], fd[:3], atol=1e-6 * float(grad.abs().max()), rtol=1e-5)


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sink_padding_leaves_real_nodes_unchanged(name):
    enc = cached(name)
    pos, z, edge_index, shift, batch, ng = molecules()
    n = pos.shape[0]
    ref = enc(make_inputs(pos, z, edge_index, shift, batch, ng))
    # one sink node in its own graph, three zero-length sink -> sink edges
    pos_p = torch.cat([pos, torch.zeros(1, 3, dtype=pos.dtype)]).requires_grad_(True)
    z_p = torch.cat([z, torch.zeros(1, dtype=z.dtype)])
    ei_p = torch.cat([edge_index, torch.full((2, 3), n)], dim=1)
    shift_p = torch.cat([shift, torch.zeros(3, 3, dtype=shift.dtype)])
    batch_p = torch.cat([batch, torch.tensor([ng])])
    out = enc(make_inputs(pos_p, z_p, ei_p, shift_p, batch_p, ng + 1))
    torch.testing.assert_close(out.scalar[:n], ref.scalar, atol=1e-12, rtol=0)
    if out.vector is not None:
        torch.testing.assert_close(out.vector[:n], ref.vector, atol=1e-12, rtol=0)
    assert torch.isfinite(out.scalar).all()
    loss = out.scalar.sum() + (out.vector.sum() if out.vector is not None else 0.0)
    names, params = zip(*enc.named_parameters(), strict=True)
    grads = torch.autograd.grad(loss, [pos_p, *params], allow_unused=True)
    assert torch.isfinite(grads[0]).all()
    for pname, g in zip(names, grads[1:], strict=True):
        assert g is None or torch.isfinite(g).all(), pname


@pytest.mark.parametrize("name", BASIC)
def test_isolated_atom_without_edges(name):
    pos = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    empty = torch.zeros(2, 0, dtype=torch.long)
    inputs = make_inputs(
        pos, torch.tensor([3]), empty, torch.zeros(0, 3, dtype=torch.float64), torch.zeros(1, dtype=torch.long), 1
    )
    out = cached(name)(inputs)
    assert out.scalar.shape == (1, DIMS.hidden_dim) and torch.isfinite(out.scalar).all()
    (grad,) = torch.autograd.grad(out.scalar.sum(), pos, allow_unused=True)
    assert grad is None or bool((grad == 0).all())


# ----------------------------------------------------------------------------- dtypes, checkpointing, seeds


@pytest.mark.parametrize("name", BASIC)
def test_bfloat16_forward(name):
    pos, z, edge_index, shift, batch, ng = molecules()
    ref = cached(name)(make_inputs(pos, z, edge_index, shift, batch, ng)).scalar.detach()
    enc16 = build(name, dtype=torch.bfloat16)  # same seed as the cached float64 module
    out = enc16(make_inputs(pos.float(), z, edge_index, shift.float(), batch, ng, dtype=torch.bfloat16)).scalar
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    rel = torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)
    assert rel < 0.1
    # float32 geometry into a bf16 module (the geometry stays float32 inside)
    inputs = make_inputs(pos.float(), z, edge_index, shift.float(), batch, ng, dtype=torch.bfloat16)
    inputs.edge_vec = (pos[edge_index[0]] - pos[edge_index[1]] + shift).float()
    out32 = enc16(inputs).scalar
    assert out32.dtype == torch.bfloat16
    assert torch.linalg.vector_norm(out32.double() - ref) / torch.linalg.vector_norm(ref) < 0.1


@pytest.mark.parametrize("name", BASIC)
def test_checkpointing_same_outputs_and_gradients(name):
    pos, z, edge_index, shift, batch, ng = molecules()
    enc = cached(name)
    results = []
    try:
        for flag in (False, True):
            enc.dims = EncoderDims(**{**DIMS.__dict__, "conv_checkpointing": flag})
            p = pos.clone().requires_grad_(True)
            out = enc(make_inputs(p, z, edge_index, shift, batch, ng)).scalar
            grads = torch.autograd.grad(out.sum(), [p, *enc.parameters()])
            results.append((out.detach(), grads))
    finally:
        enc.dims = DIMS
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-12, rtol=0)
    for g0, g1 in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(g0, g1, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", BASIC)
def test_deterministic_given_seed(name):
    pos, z, edge_index, shift, batch, ng = molecules()
    inputs = make_inputs(pos, z, edge_index, shift, batch, ng)
    a = cached(name)(inputs).scalar
    b = build(name, seed=0)(inputs).scalar
    assert torch.equal(a, b)
    if name == "dimenet":  # cheap to build: a different seed gives a different model
        assert not torch.equal(a, build(name, seed=1)(inputs).scalar)


@pytest.mark.parametrize("name", ["dimenet", "mace"])
def test_without_species_uses_linear_on_x(name):
    dims = EncoderDims(**{**DIMS.__dict__, "num_species": 0, "node_in": 2})
    enc = build(name, dims=dims)
    pos, z, edge_index, shift, batch, ng = molecules()
    inputs = make_inputs(pos, z, edge_index, shift, batch, ng)
    inputs.x = torch.cat([inputs.x, torch.rand_like(inputs.x)], dim=1)
    out = enc(inputs)
    assert out.scalar.shape == (pos.shape[0], dims.hidden_dim) and torch.isfinite(out.scalar).all()


def test_default_parameter_counts():
    dims = EncoderDims(
        node_in=1,
        edge_in=0,
        graph_in=0,
        hidden_dim=64,
        num_conv_layers=3,
        radius=5.0,
        max_neighbours=None,
        num_radial=16,
        num_species=100,
    )
    # MACE at this size (2,309,120 parameters with the default max_ell 2) takes seconds to build: only DimeNet here
    assert sum(p.numel() for p in DimeNetEncoder(dims, DimeNetConfig()).parameters()) == 1_087_568


def test_mace_elements_size_the_per_species_tables():
    """``elements`` gives the per-species tables one row per listed element (mace-torch's z
    table): the parameter count is linear in their number, far below one row per atomic number."""

    def count(elements):
        cfg = MACEConfig(max_ell=2, node_max_ell=1, correlation=2, radial_mlp_dim=8, elements=elements)
        return sum(p.numel() for p in MACEEncoder(DIMS, cfg).parameters())

    two, four, every = count((1, 2)), count((1, 3, 5, 7)), count(None)
    assert four - two > 0 and every - four == 3 * (four - two)  # num_species = 10 rows without elements
    cfg = MACEConfig.from_dict({"elements": ["O", "H", 6, "N"]})
    assert cfg.elements == (1, 6, 7, 8)
    for bad, message in ((["H", "H"], "listed twice"), (["Xx"], r"elements\[0\]"), ([], "non-empty"), ([0], "1..118")):
        with pytest.raises(ModelConfigError, match=message):
            MACEConfig.from_dict({"elements": bad})
    with pytest.raises(ModelConfigError, match="not below num_species"):
        MACEEncoder(DIMS, MACEConfig(elements=(1, 29)))


def test_mace_defaults_are_the_small_published_model():
    config = MACEConfig()
    assert (config.max_ell, config.correlation, config.radial_mlp_dim, config.radial_mlp_layers) == (2, 3, 64, 3)


def test_mace_first_layer_residual_is_an_added_element_dependent_term():
    """``residual_first_layer`` adds ``skip_first(h0, one-hot)`` to the first layer and nothing
    else: with its weights zeroed the encoder is the one without it, weight for weight."""
    config = CONFIGS["mace_torch_res1"][1]
    torch.manual_seed(0)
    with_first = MACEEncoder(DIMS, config).double()
    without = MACEEncoder(DIMS, dataclasses.replace(config, residual_first_layer=False)).double()
    assert with_first.skip_first is not None and without.skip_first is None
    state = {k: v for k, v in with_first.state_dict().items() if not k.startswith("skip_first.")}
    without.load_state_dict(state, strict=True)
    inputs = make_inputs(*molecules())
    assert not torch.allclose(with_first(inputs).scalar, without(inputs).scalar)
    with torch.no_grad():
        with_first.skip_first.weight.zero_()
    torch.testing.assert_close(with_first(inputs).scalar, without(inputs).scalar, rtol=0, atol=0)


def test_mace_input_scales():
    """``scales``: unit variance (hydra-models 0.2) unless ``"mace-torch"`` (the raw Bessel basis,
    the one-hot unscaled, the embedding at variance 1 / rows) is asked for; others are refused."""
    torch.manual_seed(0)
    unit = MACEEncoder(DIMS, MACEConfig(elements=(1, 6, 7, 8), radial_mlp_dim=8))
    mace_torch = MACEEncoder(DIMS, MACEConfig(elements=(1, 6, 7, 8), radial_mlp_dim=8, scales="mace-torch"))
    assert (mace_torch.radial_scale, mace_torch.attrs_scale) == (1.0, 1.0)
    assert unit.radial_scale == pytest.approx(RADIUS * (RADIUS / 2) ** 0.5) and unit.attrs_scale == 2.0
    assert float(mace_torch.species.weight.detach().std()) == pytest.approx(0.5, rel=0.25)
    assert float(unit.species.weight.detach().std()) == pytest.approx(1.0, rel=0.25)
    with pytest.raises(ModelConfigError, match=r"Architecture.scales.*mace-torch"):
        MACEConfig.from_dict({"scales": "unit-variance"})


@pytest.mark.parametrize("name", ["dimenet", "dimenet_padded"])
def test_dimenet_factorised_interaction_matches_pyg_block(name):
    """The interaction on the per-edge factorised 2D basis equals PyG's block on the materialised one."""
    from torch_geometric.nn.models.dimenet import InteractionPPBlock

    pos, z, edge_index, shift, batch, ng = molecules()
    inputs = make_inputs(pos, z, edge_index, shift, batch, ng)
    enc = cached(name)
    vec = inputs.edge_vec
    dist = torch.linalg.vector_norm(vec, dim=-1)
    idx_kj, idx_ji, weight = enc.triplets(edge_index, pos.shape[0], vec)
    cos = (vec[idx_ji] * vec[idx_kj]).sum(-1) / (dist[idx_kj] * dist[idx_ji])
    rbf = enc.rbf(dist)
    rad, ang = enc.sbf.radial(dist), enc.sbf.angular(cos)
    sbf = enc.sbf(dist, cos, idx_kj)  # [T, L * R]
    if weight is not None:
        ang = ang * weight.to(ang.dtype).unsqueeze(-1)
        sbf = sbf * weight.to(sbf.dtype).unsqueeze(-1)
    assert sbf.shape[1] == enc.sbf.num_spherical * enc.sbf.num_radial and int((sbf != 0).any(-1).sum()) > 10
    m = torch.randn(
        edge_index.shape[1], DIMS.hidden_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    block = enc.interaction_blocks[0]
    ours = block(m, rbf, rad, ang, idx_kj, None, idx_kj, idx_ji)
    reference = InteractionPPBlock.forward(block, m, rbf, sbf, idx_kj, idx_ji)
    torch.testing.assert_close(ours, reference, atol=1e-12, rtol=1e-10)
    assert not torch.allclose(ours, m)


def lattice_cluster():
    """A 2x2x2 simple-cubic cluster (spacing 1.2) twice, species varying: lattice data, where
    a handful of lengths and angles repeat over every triplet."""
    side = torch.arange(2, dtype=torch.float64) * 1.2
    cube = torch.cartesian_prod(side, side, side)
    pos = torch.cat([cube, cube + 10.0])
    batch = torch.arange(2).repeat_interleave(8)
    z = torch.randint(1, DIMS.num_species, (16,), generator=torch.Generator().manual_seed(3))
    edge_index, shift, _ = brute_force_edges(pos, batch, RADIUS)
    return pos, z, edge_index, shift, batch, 2


def test_dimenet_evaluates_the_spherical_basis_per_distinct_triplet_geometry(monkeypatch):
    """Under the ``"distinct"`` backend, on lattice data without forces, the spherical basis and
    its projections run once per distinct (d_kj, angle) pair: the embeddings and parameter
    gradients equal the per-triplet path's; with a gradient on the geometry (forces) every
    triplet is evaluated."""
    from hydragnn.models.nn import edges as edges_module
    from hydragnn.models.nn import use_backend

    pos, z, edge_index, shift, batch, ng = lattice_cluster()
    inputs = make_inputs(pos, z, edge_index, shift, batch, ng)
    enc = build("dimenet")
    assert use_backend(enc, "distinct").switched
    rows = []
    enc.interaction_blocks[0].lin_sbf2.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    results = []
    for fraction in (edges_module.SHARED_MAX_FRACTION, -1.0):
        monkeypatch.setattr(edges_module, "SHARED_MAX_FRACTION", fraction)
        enc.zero_grad()
        out = enc(inputs).scalar
        out.square().sum().backward()
        results.append((out, [p.grad.clone() for p in enc.parameters()]))
    num_triplets = enc.triplets(edge_index, pos.shape[0], inputs.edge_vec)[0].shape[0]
    assert rows[0] * 10 < num_triplets == rows[1]
    (out, grads), (ref, ref_grads) = results
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    for g, g_ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-8)
    monkeypatch.undo()
    moving = dataclasses.replace(inputs, edge_vec=inputs.edge_vec.clone().requires_grad_())
    enc(moving)
    assert rows[2] == num_triplets


def test_spherical_bessel_against_closed_forms():
    from hydragnn.models.nn.dimenet_basis import SphericalBessel, spherical_bessel_zeros

    x = torch.linspace(0.0, 30.0, 3001, dtype=torch.float64)
    j = SphericalBessel(3)(x.view(-1, 1, 1).expand(-1, 3, 1).contiguous())[:, :, 0]
    xs = torch.where(x == 0, torch.ones_like(x), x)
    j0 = torch.where(x == 0, torch.ones_like(x), torch.sin(xs) / xs)
    j1 = torch.where(x == 0, torch.zeros_like(x), torch.sin(xs) / xs**2 - torch.cos(xs) / xs)
    j2 = torch.where(x == 0, torch.zeros_like(x), (3 / xs**2 - 1) * torch.sin(xs) / xs - 3 * torch.cos(xs) / xs**2)
    big = x > 0.5  # the closed forms lose digits below
    torch.testing.assert_close(j[:, 0], j0, atol=1e-12, rtol=0)
    torch.testing.assert_close(j[big, 1], j1[big], atol=1e-11, rtol=0)
    torch.testing.assert_close(j[big, 2], j2[big], atol=1e-10, rtol=0)
    zeros = spherical_bessel_zeros(3, 4)
    assert zeros[0] == pytest.approx([math.pi * (n + 1) for n in range(4)])
    assert zeros[1][0] == pytest.approx(4.493409457909064) and zeros[2][0] == pytest.approx(5.763459196894550)


# ----------------------------------------------------------------------------- capture safety on CPU


def _fake_forward_and_forces(enc, inputs):
    """Run forward + forces on fake tensors: data-dependent shapes and ``.item()`` raise there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in fields.items()}
        pos = fake["pos"].requires_grad_(True)
        src, dst = fake["edge_index"][0], fake["edge_index"][1]
        fake["edge_vec"] = pos[src] - pos[dst]
        out = enc(GraphInputs(**fake))
        (grad,) = torch.autograd.grad(out.scalar.sum(), pos)
        return out.scalar.shape, grad.shape


@pytest.mark.parametrize("name", ["dimenet_padded", "mace"])
def test_forward_and_forces_have_no_data_dependent_shapes(name):
    pos, z, edge_index, shift, batch, ng = molecules()
    shapes = _fake_forward_and_forces(cached(name), make_inputs(pos, z, edge_index, shift, batch, ng))
    assert shapes == ((pos.shape[0], DIMS.hidden_dim), pos.shape)


def test_exact_dimenet_triplets_are_data_dependent():
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    pos, z, edge_index, shift, batch, ng = molecules()
    with pytest.raises(DynamicOutputShapeException):
        _fake_forward_and_forces(cached("dimenet"), make_inputs(pos, z, edge_index, shift, batch, ng))


# ----------------------------------------------------------------------------- CUDA graph capture


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["dimenet_padded", "mace"])
def test_cuda_graph_capture(name):
    enc = build(name, dtype=torch.float32).cuda()
    pos, z, edge_index, shift, batch, ng = molecules()
    inputs = make_inputs(
        pos.float().cuda(), z.cuda(), edge_index.cuda(), shift.float().cuda(), batch.cuda(), ng, torch.float32
    )
    enc(inputs)  # the first call may synchronise (constants cast to the device once): engines capture from the second
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = enc(inputs).scalar
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            enc(inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = enc(inputs).scalar
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, atol=1e-5, rtol=1e-5)
