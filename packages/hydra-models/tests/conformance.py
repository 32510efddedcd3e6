"""Encoder conformance suite, written once and applied to every registered encoder.

Use it for any encoder (NequIP style)::

    @pytest.mark.parametrize("encoder_name", ["MyEncoder"])
    class TestMyEncoder(ConformanceTests):
        pass

Each check builds a tiny MLIP model (hidden 16, 2 layers) around the encoder. An encoder
class may set ``conformance_config = {...}`` (extra ``Architecture`` keys used by these tests).
"""

from __future__ import annotations

import torch
from graphs import (
    CLUSTER_SCHEMA,
    SCHEMA,
    assert_outputs_close,
    brute_force_edges,
    cluster_samples,
    collate,
    default_dtype,
    periodic_samples,
    random_rotation,
    supercell_sample,
    to_dtype,
    voigt_to_matrix,
)
from host_sync import HostSyncDetector

from hydragnn.models import ENCODERS, build_model, load_artifact, pad_with_sink, save_artifact

CUTOFF = 4.0
REGISTERED_ENCODERS: tuple[str, ...] = tuple(sorted(n for n in ENCODERS if ENCODERS[n].optional_dependency is None))
"""The core registry as ``hydragnn.models`` fills it (snapshot taken when conftest imports this
module, so encoder modules that other test files import directly do not change the
parametrisation). Encoders with an ``optional_dependency`` (UMA, AllScAIP: the ``fairchem``
extra) run the same checks from their own test module, which skips without the extra."""
SCALAR_OUTPUTS = ("energy", "gap", "atomic_energy", "charge")

VARIANTS: dict[str, dict] = {}
"""Conformance subjects beyond the plain encoders: id -> ``Architecture`` keys (with
``mpnn_type``, which may be None for a standalone EquivariantTransformer). Add with
:func:`register_variant`; the checks accept these ids wherever they accept an encoder name."""


def register_variant(name: str, **arch) -> str:
    """Add a conformance subject ``name`` (e.g. ``"SchNet+GPS-performer"``) and return it."""
    if name in ENCODERS or (name in VARIANTS and VARIANTS[name] != arch):
        raise ValueError(f"conformance variant {name!r} is already taken")
    VARIANTS[name] = dict(arch)
    return name


def is_equivariant(name: str) -> bool:
    """Whether subject ``name`` returns vector features (encoder class or variant)."""
    if name in VARIANTS:
        arch = VARIANTS[name]
        if arch.get("global_attn_engine") == "EquivariantTransformer":
            return True
        return ENCODERS[arch["mpnn_type"]].equivariant
    return ENCODERS[name].equivariant


def small_arch(name: str, **overrides) -> dict:
    """A tiny MLIP ``Architecture`` for encoder (or variant) ``name`` (+ its ``conformance_config``)."""
    variant = VARIANTS.get(name, {"mpnn_type": name})
    mpnn_type = variant["mpnn_type"]
    arch = {
        "mpnn_type": mpnn_type,
        "hidden_dim": 16,
        "num_conv_layers": 2,
        "radius": CUTOFF,
        "num_radial": 8,
        "enable_interatomic_potential": True,
        "output_heads": {"graph": {"num_sharedlayers": 1, "num_headlayers": 1}, "node": {"num_headlayers": 1}},
    }
    if mpnn_type is not None:
        arch.update(getattr(ENCODERS[mpnn_type], "conformance_config", {}))
    arch.update(variant)
    arch.update(overrides)
    return arch


def build(name: str, seed: int = 0, schema=SCHEMA, **overrides):
    """A seeded tiny model in eval mode."""
    torch.manual_seed(seed)
    return build_model(small_arch(name, **overrides), schema).eval()


# ----------------------------------------------------------------------------------- checks
def check_deterministic(name: str) -> None:
    a, b = build(name, seed=3), build(name, seed=3)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), f"parameter {ka} differs between two builds with the same seed"
    batch = collate(periodic_samples(CUTOFF)[:3])
    oa, ob = a(batch), b(batch)
    for key in oa:
        assert torch.equal(oa[key], ob[key]), f"output {key!r} is not deterministic"


def check_permutation(name: str) -> None:
    model = build(name)
    data = periodic_samples(CUTOFF)[1]
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(data.num_nodes, generator=g)
    inv = torch.argsort(perm)
    edge_perm = torch.randperm(data.edge_index.shape[1], generator=g)
    moved = data.clone()
    for key in ("x", "pos", "atomic_number", "atomic_energy", "forces", "charge", "node_output"):
        moved[key] = data[key][perm]
    moved.edge_index = inv[data.edge_index][:, edge_perm]
    moved.edge_shift = data.edge_shift[edge_perm]
    ref, out = model(collate([data])), model(collate([moved]))
    for key in ("energy", "gap", "stress"):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
    for key in ("atomic_energy", "charge", "forces"):
        torch.testing.assert_close(out[key], ref[key][perm], rtol=1e-4, atol=1e-5)


def check_rotation_translation(name: str, seed: int = 0) -> None:
    model = build(name)
    batch = collate(periodic_samples(CUTOFF)[:3])
    rot = random_rotation(seed)
    shift = torch.tensor([0.3, -1.7, 2.2])
    moved = batch.clone()
    moved.pos = batch.pos @ rot.T + shift
    moved.cell = batch.cell @ rot.T
    moved.edge_shift = batch.edge_shift @ rot.T
    ref, out = model(batch), model(moved)
    assert_outputs_close(out, ref, keys=SCALAR_OUTPUTS)
    torch.testing.assert_close(out["forces"], ref["forces"] @ rot.T, rtol=1e-4, atol=1e-5)
    sr, so = voigt_to_matrix(ref["stress"]), voigt_to_matrix(out["stress"])
    torch.testing.assert_close(so, rot @ sr @ rot.T, rtol=1e-4, atol=1e-5)
    # non-periodic clusters: translation and rotation
    clusters = collate(cluster_samples(CUTOFF))
    cmodel = build(name, schema=CLUSTER_SCHEMA)
    moved = clusters.clone()
    moved.pos = clusters.pos @ rot.T - shift
    ref, out = cmodel(clusters), cmodel(moved)
    assert_outputs_close(out, ref, keys=SCALAR_OUTPUTS)
    torch.testing.assert_close(out["forces"], ref["forces"] @ rot.T, rtol=1e-4, atol=1e-5)


def check_vector_equivariance(name: str, seed: int = 1) -> None:
    """Equivariant encoders: ``NodeEmbedding.vector [N, 3, C]`` rotates with the positions."""
    model = build(name)
    batch = collate(periodic_samples(CUTOFF)[:2])
    rot = random_rotation(seed)
    moved = batch.clone()
    moved.pos, moved.cell, moved.edge_shift = batch.pos @ rot.T, batch.cell @ rot.T, batch.edge_shift @ rot.T
    with torch.no_grad():
        ref = model.encode(model.graph_inputs(batch, batch.pos, batch.edge_index, batch.edge_shift))
        out = model.encode(model.graph_inputs(moved, moved.pos, moved.edge_index, moved.edge_shift))
    assert ref.vector is not None and ref.vector.dim() == 3 and ref.vector.shape[1] == 3
    torch.testing.assert_close(out.scalar, ref.scalar, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.vector, torch.einsum("ij,njc->nic", rot, ref.vector), rtol=1e-4, atol=1e-5)


def _energy_fd(model, data, pos, cell) -> float:
    moved = data.clone()
    moved.pos, moved.cell = pos, cell.reshape(1, 3, 3)
    moved.edge_index, moved.edge_shift = brute_force_edges(pos, CUTOFF, cell, data.pbc)
    with torch.no_grad():
        return float(model(collate([moved]), compute_forces=False, compute_stress=False)["energy"].sum())


def finite_difference_forces_stress(model, data, h: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Central differences of ``model``'s energy on periodic ``data`` (step ``h``, in ``data``'s dtype).

    Returns ``forces [N, 3]`` (``-dE/dpos``) and ``stress [3, 3]`` (``dE/dstrain / volume`` under a
    symmetric strain of positions and cell).
    """
    pos, cell = data.pos.clone(), data.cell.reshape(3, 3).clone()
    forces = torch.zeros_like(pos)
    for i in range(pos.shape[0]):
        for k in range(3):
            plus, minus = pos.clone(), pos.clone()
            plus[i, k] += h
            minus[i, k] -= h
            forces[i, k] = -(_energy_fd(model, data, plus, cell) - _energy_fd(model, data, minus, cell)) / (2 * h)
    volume = abs(float(torch.det(cell)))
    stress = torch.zeros(3, 3, dtype=pos.dtype)
    for i in range(3):
        for j in range(i, 3):
            values = []
            for sign in (1.0, -1.0):
                strain = torch.eye(3, dtype=pos.dtype)
                strain[i, j] += sign * h
                if i != j:
                    strain[j, i] += sign * h
                values.append(_energy_fd(model, data, pos @ strain, cell @ strain))
            stress[i, j] = stress[j, i] = (values[0] - values[1]) / ((2 if i == j else 4) * h * volume)
    return forces, stress


def check_finite_differences(name: str, h: float = 1e-4) -> None:
    """Forces and stress against central differences of the energy, in float64."""
    with default_dtype(torch.float64):
        model = build(name, precision="fp64")
        data = to_dtype(periodic_samples(CUTOFF)[1], torch.float64)
        out = model(collate([data]))
        forces, stress = finite_difference_forces_stress(model, data, h)
        torch.testing.assert_close(out["forces"], forces, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(voigt_to_matrix(out["stress"])[0], stress, rtol=1e-5, atol=1e-8)


def check_cutoff_continuity(name: str) -> None:
    """The energy is continuous when an atom crosses the cutoff radius of another (fp64 model).

    Atom 4 of a 5-atom cluster is put on a line through atom 0 at ``CUTOFF -+ delta`` (no other
    pair near the cutoff). A continuous energy changes by O(delta): the jump at ``delta = 1e-6``
    must be under 1% of the jump at ``delta = 1e-3`` (plus 1e-6 for float32 internals); a hard
    neighbour count, mean or mask jumps by the same amount at both.
    """
    with default_dtype(torch.float64):
        model = build(name, precision="fp64", schema=CLUSTER_SCHEMA)
        data = to_dtype(cluster_samples(CUTOFF)[0], torch.float64)
        anchor, others = data.pos[0], data.pos[1:4]
        axes = torch.cat([torch.eye(3), -torch.eye(3)]).to(torch.float64)
        direction = next(u for u in axes if ((others - (anchor + CUTOFF * u)).norm(dim=-1) - CUTOFF).abs().min() > 0.3)

        def jump(delta: float) -> float:
            energies = []
            for sign in (-1.0, 1.0):
                moved = data.clone()
                moved.pos = data.pos.clone()
                moved.pos[4] = anchor + (CUTOFF + sign * delta) * direction
                moved.edge_index, moved.edge_shift = brute_force_edges(moved.pos, CUTOFF, None, None)
                with torch.no_grad():
                    out = model(collate([moved]), compute_forces=False, compute_stress=False)
                energies.append(float(out["energy"].sum()))
            return abs(energies[1] - energies[0])

        large, small = jump(1e-3), jump(1e-6)
        assert small <= 1e-2 * large + 1e-6, (
            f"{name}: the energy jumps by {small:.3g} when an atom crosses the cutoff (by {large:.3g} over 2e-3 Å)"
        )


def check_batch_equals_single(name: str) -> None:
    model = build(name)
    samples = periodic_samples(CUTOFF)[:4]
    out = model(collate(samples))
    singles = [model(collate([s])) for s in samples]
    for key in out:
        torch.testing.assert_close(out[key], torch.cat([s[key] for s in singles]), rtol=1e-5, atol=1e-6)


def check_padding(name: str) -> None:
    """Padding by a sink graph leaves real outputs (and parameter gradients) unchanged."""
    model = build(name)
    batch = collate(periodic_samples(CUTOFF)[:3])
    n, b = batch.num_nodes, batch.num_graphs
    padded = pad_with_sink(batch, extra_nodes=3, extra_edges=7)
    ref, out = model(batch), model(padded)
    for key, value in out.items():
        assert torch.isfinite(value).all(), f"output {key!r} has non-finite values with padding"
        rows = ref[key].shape[0]
        assert value.shape[0] == rows + (3 if rows == n else 1 if rows == b else 0)
        torch.testing.assert_close(value[:rows], ref[key], rtol=1e-5, atol=1e-6)
    grads = []
    model.train()
    for x in (batch, padded):
        model.zero_grad()
        o = model(x)
        (o["energy"][:b].sum() + o["forces"][:n].square().sum() + o["gap"][:b].sum()).backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    for key in grads[0]:
        assert torch.isfinite(grads[1][key]).all(), f"gradient of {key} is not finite with padding"
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-4, atol=1e-6)


def check_capture_safe(name: str) -> None:
    """No host synchronisation or data-dependent shape in forward, forces and stress."""
    model = build(name)
    padded = pad_with_sink(collate(periodic_samples(CUTOFF)[:2]), extra_nodes=2, extra_edges=3)
    model(padded)  # warm-up: lazy initialisation may legitimately inspect data once
    with HostSyncDetector() as detector:
        model(padded)
    assert not detector.violations, f"{name}: host-synchronising ops in forward: {sorted(set(detector.violations))}"


def check_periodic_supercell(name: str) -> None:
    model = build(name)
    small, big = supercell_sample(CUTOFF)
    a, b = model(collate([small])), model(collate([big]))
    n = small.num_nodes
    torch.testing.assert_close(b["energy"] / big.num_nodes, a["energy"] / n, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b["forces"][:n], a["forces"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b["forces"][n:], a["forces"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b["stress"], a["stress"], rtol=1e-4, atol=1e-6)


def check_artifact_round_trip(name: str, tmp_path) -> None:
    model = build(name)
    batch = collate(periodic_samples(CUTOFF)[:3])
    path = save_artifact(model, tmp_path / f"{name}.hydra", species=[29, 79])
    loaded = load_artifact(path)
    ref, out = model(batch), loaded(batch)
    for key in ref:
        assert torch.equal(ref[key], out[key]), f"output {key!r} differs after save/load"


def check_precisions(name: str) -> None:
    """float64 and bfloat16 models run; bf16 stays within 10 % of the float32 outputs."""
    batch = collate(periodic_samples(CUTOFF)[:3])
    ref = build(name)
    ref_out = ref(batch)
    for precision, tol in (("fp64", 1e-4), ("bf16", 0.1)):
        model = build(name, precision=precision)
        model.load_state_dict(ref.state_dict())
        dtype = torch.float64 if precision == "fp64" else torch.float32
        out = model(to_dtype(batch, dtype))
        for key in ("energy", "forces", "gap", "charge"):
            assert torch.isfinite(out[key]).all(), f"{precision}: output {key!r} is not finite"
            err = (out[key].double() - ref_out[key].double()).norm() / ref_out[key].double().norm().clamp(min=1e-6)
            assert err < tol, f"{precision}: output {key!r} deviates from float32 by {float(err):.3g} (> {tol})"


def check_checkpointing(name: str) -> None:
    """``conv_checkpointing`` gives the same outputs and gradients (training on forces)."""
    batch = collate(periodic_samples(CUTOFF)[:2])
    results = []
    for flag in (False, True):
        model = build(name, conv_checkpointing=flag).train()
        out = model(batch)
        loss, _ = model.loss(out, batch)
        loss.backward()
        results.append((out, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}))
    (o1, g1), (o2, g2) = results
    assert_outputs_close(o2, o1, rtol=1e-6, atol=1e-7)
    assert sorted(g1) == sorted(g2)
    for key in g1:
        torch.testing.assert_close(g2[key], g1[key], rtol=1e-5, atol=1e-7)


def skip_by_design(name: str, check: str) -> None:
    """Skip ``check`` for an encoder that lists it in ``conformance_skips`` (check -> reason)."""
    mpnn_type = VARIANTS.get(name, {"mpnn_type": name})["mpnn_type"]
    reason = getattr(ENCODERS.get(mpnn_type), "conformance_skips", {}).get(check)
    if reason:
        import pytest

        pytest.skip(f"{name}: {reason}")


class ConformanceTests:
    """Test mixin: every method takes the ``encoder_name`` parameter (or fixture). An encoder
    class may list checks it cannot pass by design in ``conformance_skips`` (check -> reason:
    ``rotation_translation``, ``finite_differences``); those are skipped with the reason."""

    def test_deterministic(self, encoder_name):
        check_deterministic(encoder_name)

    def test_permutation_invariance(self, encoder_name):
        check_permutation(encoder_name)

    def test_rotation_translation(self, encoder_name):
        skip_by_design(encoder_name, "rotation_translation")
        check_rotation_translation(encoder_name)

    def test_vector_equivariance(self, encoder_name):
        if not is_equivariant(encoder_name):
            import pytest

            pytest.skip(f"{encoder_name} is not equivariant (no vector features)")
        check_vector_equivariance(encoder_name)

    def test_forces_stress_finite_differences(self, encoder_name):
        skip_by_design(encoder_name, "finite_differences")
        check_finite_differences(encoder_name)

    def test_cutoff_continuity(self, encoder_name):
        check_cutoff_continuity(encoder_name)

    def test_batch_equals_single(self, encoder_name):
        check_batch_equals_single(encoder_name)

    def test_padded_equals_unpadded(self, encoder_name):
        check_padding(encoder_name)

    def test_capture_safe(self, encoder_name):
        check_capture_safe(encoder_name)

    def test_periodic_supercell(self, encoder_name):
        check_periodic_supercell(encoder_name)

    def test_artifact_round_trip(self, encoder_name, tmp_path):
        check_artifact_round_trip(encoder_name, tmp_path)

    def test_precisions(self, encoder_name):
        check_precisions(encoder_name)

    def test_checkpointing(self, encoder_name):
        check_checkpointing(encoder_name)
