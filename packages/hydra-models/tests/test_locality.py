"""Every built-in encoder's energy is a sum of atomic terms within its declared receptive field:
a cut-out cluster (a domain-decomposed engine's rank) gives the periodic atomic energies, forces
and virial to 1e-12 in float64 (1e-16 measured), and a shell one radius short does not (the negative control)."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import ModelError, locality_problems, receptive_field
from hydragnn.models.testing import REGISTERED_ENCODERS, build, check_locality, cut_out
from hydragnn.models.testing.graphs import periodic_samples, to_dtype

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
