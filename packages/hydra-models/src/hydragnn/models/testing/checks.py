"""The conformance checks: physics every encoder must respect, independent of the encoder.

Each takes a :class:`~.subjects.Subject` (or the name of an encoder or variant) and raises an
``AssertionError`` naming what broke.
"""

from __future__ import annotations

import copy
import pathlib
from typing import cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch import nn
from torch_geometric.data import Data

from hydragnn.models import Committee, HydraModel, load_artifact, pad_with_sink, save_artifact
from hydragnn.models.execution import Execution

from .graphs import (
    CLUSTER_SCHEMA,
    assert_outputs_close,
    brute_force_edges,
    cluster_samples,
    collate,
    default_dtype,
    lattice_samples,
    periodic_samples,
    random_rotation,
    supercell_sample,
    to_dtype,
    voigt_to_matrix,
)
from .host_sync import HostSyncDetector
from .subjects import CUTOFF, SCALAR_OUTPUTS, Subject, _subject
from .subnormal import SubnormalDetector


def check_deterministic(subject: Subject | str) -> None:
    s = _subject(subject)
    a, b = s.build(seed=3), s.build(seed=3)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), f"parameter {ka} differs between two builds with the same seed"
    batch = collate(periodic_samples(CUTOFF)[:3])
    oa, ob = a(batch), b(batch)
    for key in oa:
        assert torch.equal(oa[key], ob[key]), f"output {key!r} is not deterministic"


def check_permutation(subject: Subject | str) -> None:
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    model = s.build()
    data = periodic_samples(CUTOFF)[1]
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(cast(int, data.num_nodes), generator=g)  # (a prepared sample: nodes and edges)
    inv = torch.argsort(perm)
    edge_perm = torch.randperm(cast(torch.Tensor, data.edge_index).shape[1], generator=g)
    moved = data.clone()
    for key in ("x", "pos", "atomic_number", "atomic_energy", "forces", "charge", "node_output"):
        moved[key] = data[key][perm]
    moved.edge_index = inv[data.edge_index][:, edge_perm]
    moved.edge_shift = data.edge_shift[edge_perm]
    ref, out = model(collate([data])), model(collate([moved]))
    for key in ("energy", "gap", "stress"):
        torch.testing.assert_close(out[key], ref[key], rtol=rtol, atol=atol)
    for key in ("atomic_energy", "charge", "forces"):
        torch.testing.assert_close(out[key], ref[key][perm], rtol=rtol, atol=atol)


def check_rotation_translation(subject: Subject | str, seed: int = 0) -> None:
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    model = s.build()
    batch = collate(periodic_samples(CUTOFF)[:3])
    rot = random_rotation(seed)
    shift = torch.tensor([0.3, -1.7, 2.2])
    moved = batch.clone()
    moved.pos = cast(torch.Tensor, batch.pos) @ rot.T + shift  # (prepared samples have positions)
    moved.cell = batch.cell @ rot.T
    moved.edge_shift = batch.edge_shift @ rot.T
    ref, out = model(batch), model(moved)
    assert_outputs_close(out, ref, keys=SCALAR_OUTPUTS, rtol=rtol, atol=atol)
    torch.testing.assert_close(out["forces"], ref["forces"] @ rot.T, rtol=rtol, atol=atol)
    sr, so = voigt_to_matrix(ref["stress"]), voigt_to_matrix(out["stress"])
    torch.testing.assert_close(so, rot @ sr @ rot.T, rtol=rtol, atol=atol)
    # non-periodic clusters: translation and rotation
    clusters = collate(cluster_samples(CUTOFF))
    cmodel = s.build(schema=CLUSTER_SCHEMA)
    moved = clusters.clone()
    moved.pos = cast(torch.Tensor, clusters.pos) @ rot.T - shift
    ref, out = cmodel(clusters), cmodel(moved)
    assert_outputs_close(out, ref, keys=SCALAR_OUTPUTS, rtol=rtol, atol=atol)
    torch.testing.assert_close(out["forces"], ref["forces"] @ rot.T, rtol=rtol, atol=atol)


def check_vector_equivariance(subject: Subject | str, seed: int = 1) -> None:
    """Equivariant encoders: ``NodeEmbedding.vector [N, 3, C]`` rotates with the positions (in
    every member of a committee)."""
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    built = s.build()
    batch = collate(periodic_samples(CUTOFF)[:2])
    rot = random_rotation(seed)
    moved = batch.clone()
    pos = cast(torch.Tensor, batch.pos)  # (prepared samples have positions)
    moved.pos, moved.cell, moved.edge_shift = pos @ rot.T, batch.cell @ rot.T, batch.edge_shift @ rot.T
    for model in getattr(built, "members", [built]):
        with torch.no_grad():
            ref = model.encode(model.graph_inputs(batch, batch.pos, batch.edge_index, batch.edge_shift))
            out = model.encode(model.graph_inputs(moved, moved.pos, moved.edge_index, moved.edge_shift))
        assert ref.vector is not None and ref.vector.dim() == 3 and ref.vector.shape[1] == 3
        torch.testing.assert_close(out.scalar, ref.scalar, rtol=rtol, atol=atol)
        torch.testing.assert_close(out.vector, torch.einsum("ij,njc->nic", rot, ref.vector), rtol=rtol, atol=atol)


def _energy_fd(model: nn.Module, data: Data, pos: torch.Tensor, cell: torch.Tensor) -> float:
    moved = data.clone()
    moved.pos, moved.cell = pos, cell.reshape(1, 3, 3)
    moved.edge_index, moved.edge_shift = brute_force_edges(pos, CUTOFF, cell, data.pbc)
    with torch.no_grad():
        return float(model(collate([moved]), compute_forces=False, compute_stress=False)["energy"].sum())


def finite_difference_forces_stress(model: nn.Module, data: Data, h: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Central differences of ``model``'s energy on periodic ``data`` (step ``h``, in ``data``'s dtype).

    Returns ``forces [N, 3]`` (``-dE/dpos``) and ``stress [3, 3]`` (``dE/dstrain / volume`` under a
    symmetric strain of positions and cell).
    """
    pos, cell = cast(torch.Tensor, data.pos).clone(), data.cell.reshape(3, 3).clone()
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


def check_finite_differences(subject: Subject | str, h: float = 1e-4) -> None:
    """Forces and stress against central differences of the energy, in float64."""
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    with default_dtype(torch.float64):
        model = s.build(precision="fp64")
        data = to_dtype(periodic_samples(CUTOFF)[1], torch.float64)
        out = model(collate([data]))
        forces, stress = finite_difference_forces_stress(model, data, h)
        fd_rtol, fd_atol = s.tol.finite_differences
        torch.testing.assert_close(out["forces"], forces, rtol=fd_rtol, atol=fd_atol)
        torch.testing.assert_close(voigt_to_matrix(out["stress"])[0], stress, rtol=fd_rtol, atol=fd_atol / 10)


def check_cutoff_continuity(subject: Subject | str) -> None:
    """The energy is continuous when an atom crosses the cutoff radius of another (fp64 model).

    Atom 4 of a 5-atom cluster is put on a line through atom 0 at ``CUTOFF -+ delta`` (no other
    pair near the cutoff). A continuous energy changes by O(delta): the jump at ``delta = 1e-6``
    must be under 1% of the jump at ``delta = 1e-3`` (plus 1e-6 for float32 internals); a hard
    neighbour count, mean or mask jumps by the same amount at both.
    """
    s = _subject(subject)
    with default_dtype(torch.float64):
        model = s.build(precision="fp64", schema=CLUSTER_SCHEMA)
        data = to_dtype(cluster_samples(CUTOFF)[0], torch.float64)
        pos = cast(torch.Tensor, data.pos)  # (prepared samples have positions)
        anchor, others = pos[0], pos[1:4]
        axes = torch.cat([torch.eye(3), -torch.eye(3)]).to(torch.float64)
        direction = next(u for u in axes if ((others - (anchor + CUTOFF * u)).norm(dim=-1) - CUTOFF).abs().min() > 0.3)

        def jump(delta: float) -> float:
            energies = []
            for sign in (-1.0, 1.0):
                moved = data.clone()
                moved.pos = pos.clone()
                moved.pos[4] = anchor + (CUTOFF + sign * delta) * direction
                moved.edge_index, moved.edge_shift = brute_force_edges(moved.pos, CUTOFF, None, None)
                with torch.no_grad():
                    out = model(collate([moved]), compute_forces=False, compute_stress=False)
                energies.append(float(out["energy"].sum()))
            return abs(energies[1] - energies[0])

        large, small = jump(1e-3), jump(1e-6)
        assert small <= 1e-2 * large + 1e-6, (
            f"{s.name}: the energy jumps by {small:.3g} when an atom crosses the cutoff (by {large:.3g} over 2e-3 Å)"
        )


def check_batch_equals_single(subject: Subject | str) -> None:
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    model = s.build()
    samples = periodic_samples(CUTOFF)[:4]
    out = model(collate(samples))
    singles = [model(collate([s])) for s in samples]
    for key in out:
        torch.testing.assert_close(
            out[key], torch.cat([s[key] for s in singles]), rtol=s.tol.batching[0], atol=s.tol.batching[1]
        )


def check_padding(subject: Subject | str) -> None:
    """Padding by a sink graph leaves real outputs (and parameter gradients) unchanged."""
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    model = s.build()
    batch = collate(periodic_samples(CUTOFF)[:3])
    n, b = batch.num_nodes, batch.num_graphs
    padded = pad_with_sink(batch, extra_nodes=3, extra_edges=7)
    ref, out = model(batch), model(padded)
    for key, value in out.items():
        assert torch.isfinite(value).all(), f"output {key!r} has non-finite values with padding"
        rows = ref[key].shape[0]
        assert value.shape[0] == rows + (3 if rows == n else 1 if rows == b else 0)
        torch.testing.assert_close(value[:rows], ref[key], rtol=s.tol.batching[0], atol=s.tol.batching[1])
    grads = []
    model.train()
    state = copy.deepcopy(model.state_dict())  # both steps from the same state (a step moves running statistics)
    for x in (batch, padded):
        model.load_state_dict(state)
        model.zero_grad()
        o = model(x)
        (o["energy"][:b].sum() + o["forces"][:n].square().sum() + o["gap"][:b].sum()).backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    for key in grads[0]:
        assert torch.isfinite(grads[1][key]).all(), f"gradient of {key} is not finite with padding"
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=rtol, atol=atol / 10)


def check_capture_safe(subject: Subject | str) -> None:
    """No host synchronisation or data-dependent shape in forward, forces and stress."""
    s = _subject(subject)
    model = s.build()
    padded = pad_with_sink(collate(periodic_samples(CUTOFF)[:2]), extra_nodes=2, extra_edges=3)
    model(padded)  # warm-up: lazy initialisation may legitimately inspect data once
    with HostSyncDetector() as detector:
        model(padded)
    assert not detector.violations, f"{s.name}: host-synchronising ops in forward: {sorted(set(detector.violations))}"


def check_no_subnormals(subject: Subject | str) -> None:
    """A float32 training step on forces (forward, loss, backward) computes no subnormal value."""
    s = _subject(subject)
    model = s.build().train()
    batch = collate(periodic_samples(CUTOFF)[:2])
    with SubnormalDetector() as detector:
        loss, _ = model.loss(model(batch), batch)
        loss.backward()
    assert not detector.found, f"{s.name}: ops computing subnormal values (count): {dict(detector.found)}"


def check_periodic_supercell(subject: Subject | str) -> None:
    s = _subject(subject)
    rtol, atol = s.tol.invariance
    model = s.build()
    small, big = supercell_sample(CUTOFF)
    a, b = model(collate([small])), model(collate([big]))
    n = small.num_nodes
    torch.testing.assert_close(
        b["energy"] / big.num_nodes, a["energy"] / n, rtol=s.tol.batching[0], atol=s.tol.batching[1]
    )
    torch.testing.assert_close(b["forces"][:n], a["forces"], rtol=rtol, atol=atol)
    torch.testing.assert_close(b["forces"][n:], a["forces"], rtol=rtol, atol=atol)
    torch.testing.assert_close(b["stress"], a["stress"], rtol=rtol, atol=atol / 10)


def check_artifact_round_trip(subject: Subject | str, tmp_path: pathlib.Path) -> None:
    s = _subject(subject)
    model = s.build()
    batch = collate(periodic_samples(CUTOFF)[:3])
    path = save_artifact(model, tmp_path / f"{s.name}.hydra", species=[29, 79])
    loaded = load_artifact(path)
    ref, out = model(batch), loaded(batch)
    for key in ref:
        assert torch.equal(ref[key], out[key]), f"output {key!r} differs after save/load"


def check_precisions(subject: Subject | str) -> None:
    """float64 and bfloat16 models run; bf16 stays within 10 % of the float32 outputs."""
    s = _subject(subject)
    batch = collate(periodic_samples(CUTOFF)[:3])
    ref = s.build()
    ref_out = ref(batch)
    for precision, tol in (("fp64", s.tol.fp64), ("bf16", s.tol.bf16)):
        model = s.build(precision=precision)
        model.load_state_dict(ref.state_dict())
        dtype = torch.float64 if precision == "fp64" else torch.float32
        out = model(to_dtype(batch, dtype))
        for key in ("energy", "forces", "gap", "charge"):
            assert torch.isfinite(out[key]).all(), f"{precision}: output {key!r} is not finite"
            err = (out[key].double() - ref_out[key].double()).norm() / ref_out[key].double().norm().clamp(min=1e-6)
            assert err < tol, f"{precision}: output {key!r} deviates from float32 by {float(err):.3g} (> {tol})"


def _same_training_step(
    subject: Subject,
    models: tuple[HydraModel | Committee, HydraModel | Committee],
    tolerances: tuple[float, float] | None = None,
) -> None:
    """Both models, in training mode on two periodic samples, give the same outputs (forces and
    stress included) and parameter gradients of the loss, within ``tolerances`` (default: the
    checkpointing ones; gradients x10 in rtol)."""
    batch = collate(periodic_samples(CUTOFF)[:2])
    results = []
    for model in models:
        model.train()
        out = model(batch)
        loss, _ = model.loss(out, batch)
        loss.backward()
        results.append((out, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}))
    (o1, g1), (o2, g2) = results
    rtol, atol = tolerances or subject.tol.checkpointing
    assert "forces" in o1 and "stress" in o1
    assert_outputs_close(o2, o1, rtol=rtol, atol=atol)
    assert sorted(g1) == sorted(g2)
    for key in g1:
        torch.testing.assert_close(g2[key], g1[key], rtol=10 * rtol, atol=atol)


def check_checkpointing(subject: Subject | str) -> None:
    """``conv_checkpointing`` gives the same outputs and gradients (training on forces)."""
    s = _subject(subject)
    _same_training_step(s, (s.build(conv_checkpointing=False), s.build(conv_checkpointing=True)))


def check_functional_derivatives(subject: Subject | str) -> None:
    """Forces and stress by ``torch.func.grad`` (``derivatives_by = "func"``, what a compiled
    training step uses) give the outputs and parameter gradients (training on forces) of
    ``autograd.grad``."""
    from hydragnn.models.derivatives import set_derivatives

    s = _subject(subject)
    functional = s.build()
    set_derivatives(functional, "func")
    _same_training_step(s, (s.build(), functional))


def check_execution_profile(subject: Subject | str, profile: str | Execution) -> None:
    """An execution profile (a name or an :class:`~hydragnn.models.execution.Execution`) computes
    what the stock model computes, within the ``execution`` tolerances: energies, forces and
    stress of rattled periodic cells in eval mode; energies without forces on ideal lattices
    (repeated edge lengths: where ``"distinct"`` shares work); and a training step's outputs and
    parameter gradients (training on forces). The optimizer step is checked by hydra-train."""
    from hydragnn.models.execution import get_profile

    s = _subject(subject)
    execution = get_profile(profile)
    reference, switched = s.build(), s.build()
    execution.switch_in(switched)
    rtol, atol = s.tol.execution
    reference.eval()
    switched.eval()
    cells = collate(periodic_samples(CUTOFF)[:3])
    assert_outputs_close(switched(cells), reference(cells), rtol=rtol, atol=atol)
    lattice = collate(lattice_samples(CUTOFF))
    energy_only = {"compute_forces": False, "compute_stress": False}
    assert_outputs_close(switched(lattice, **energy_only), reference(lattice, **energy_only), rtol=rtol, atol=atol)
    _same_training_step(s, (reference, switched), s.tol.execution)
