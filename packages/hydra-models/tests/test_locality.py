"""Every built-in encoder's energy is a sum of atomic terms within its declared receptive field:
a cut-out cluster (a domain-decomposed engine's rank) gives the periodic atomic energies, forces
and virial to 1e-12 in float64 (1e-16 measured), and a shell one radius short does not (the negative control)."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import ModelError, atomic_energies, local_energy, locality_problems, receptive_field
from hydragnn.models.testing import REGISTERED_ENCODERS, build, check_locality, cut_out
from hydragnn.models.testing.graphs import brute_force_edges, periodic_samples, to_dtype

RADIUS = 3.0  # small clusters: a 4-atom fcc cell and its images within 2-3 radii


def local_model(name: str, **overrides):
    return build(name, radius=RADIUS, **overrides).double()


@pytest.mark.parametrize("name", REGISTERED_ENCODERS)
def test_a_cut_out_cluster_gives_the_periodic_energies_forces_and_virial(name):
    sample = to_dtype(periodic_samples(RADIUS)[0], torch.float64)
    check_locality(local_model(name), sample)


def test_the_receptive_field_counts_every_shell():
    assert receptive_field(local_model("SchNet")) == pytest.approx(2 * RADIUS)
    assert receptive_field(local_model("DimeNet")) == pytest.approx(3 * RADIUS)  # its embedding block reads one
    conv_head = {"output_heads": {"node": {"type": "conv", "num_headlayers": 2, "dim_headlayers": [8, 8]}}}
    assert receptive_field(local_model("SchNet", **conv_head)) == pytest.approx(4 * RADIUS)


def test_a_conv_energy_head_is_inside_its_receptive_field():
    sample = to_dtype(periodic_samples(RADIUS)[0], torch.float64)
    check_locality(
        local_model("SchNet", output_heads={"node": {"type": "conv", "num_headlayers": 1, "dim_headlayers": [8]}}),
        sample,
    )


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"global_attn_engine": "GPS", "global_attn_heads": 2}, "global attention (GPS)"),
        ({"max_neighbours": 6}, "max_neighbours=6"),
    ],
)
def test_a_non_local_model_is_refused_by_name(overrides, named):
    model = local_model("SchNet", **overrides)
    assert any(named in p for p in locality_problems(model))
    with pytest.raises(ModelError, match="not a sum of local atomic terms"):
        receptive_field(model)


def test_the_cut_out_holds_the_cell_first_and_images_within_the_shell():
    sample = periodic_samples(RADIUS)[0]
    positions, owner = cut_out(sample.pos.double(), sample.cell.double(), 5.0)
    n = sample.pos.shape[0]
    assert torch.equal(owner[:n], torch.arange(n)) and torch.equal(positions[:n], sample.pos.double())
    nearest = torch.cdist(positions[n:], positions[:n]).min(dim=1).values
    assert bool((nearest < 5.0).all()) and bool((nearest > 0.5).all())  # images, none on an original atom


@pytest.mark.parametrize("name", ["SchNet", "PAINN", "MACE", "EGNN", "DimeNet"])
def test_local_energy_from_pair_vectors_gives_the_periodic_forces(name):
    """What ML-IAP hands a model: species, pairs (ghost-ghost included) and pair vectors. The energy
    of the cell's atoms and the pair forces dE/dr_ij, folded onto the atoms and their owners, are
    the periodic energy and forces."""
    model = local_model(name)
    sample = to_dtype(periodic_samples(RADIUS)[0], torch.float64)
    n = sample.pos.shape[0]
    pos = sample.pos.detach().requires_grad_(True)
    periodic = sample.clone()
    periodic.pos = pos
    periodic.edge_index, periodic.edge_shift = brute_force_edges(pos.detach(), RADIUS, sample.cell)
    energies = atomic_energies(model, periodic)
    (grad,) = torch.autograd.grad(energies.sum(), pos)

    positions, owner = cut_out(sample.pos.double(), sample.cell.double(), receptive_field(model))
    edge_index, _ = brute_force_edges(positions, RADIUS)
    src, dst = edge_index
    vectors = (positions[src] - positions[dst]).requires_grad_(True)
    energy, atomic = local_energy(model, sample.atomic_number.reshape(-1)[owner], edge_index, vectors, n)
    (pair,) = torch.autograd.grad(energy, vectors)
    forces = torch.zeros_like(positions).index_add_(0, src, -pair).index_add_(0, dst, pair)
    folded = torch.zeros(n, 3, dtype=torch.float64).index_add_(0, owner, forces)
    torch.testing.assert_close(energy.detach(), energies.sum().detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(atomic[:n].detach(), energies.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(folded, -grad, atol=1e-12, rtol=0)


def test_local_energy_refuses_a_non_local_model():
    model = local_model("SchNet", max_neighbours=6)
    with pytest.raises(ModelError, match="local_energy: .*max_neighbours=6"):
        local_energy(model, torch.tensor([29, 79]), torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 3), 2)
