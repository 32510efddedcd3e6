"""PAINN's ``radial_mlp``: the filter as an MLP of the radial basis (MACE's radial MLP) passes the
encoder conformance suite, leaves the default model's parameters as they were, and really feeds
the filter through the MLP."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import ModelConfigError
from hydragnn.models.testing import CUTOFF, EncoderConformance, build, register_variant
from hydragnn.models.testing.graphs import collate, periodic_samples

RADIAL = register_variant("PAINN+radial_mlp", mpnn_type="PAINN", radial_mlp=8)


@pytest.mark.parametrize("encoder_name", [RADIAL])
class TestRadialMLPConformance(EncoderConformance):
    """Invariance, forces vs finite differences, batching, padding, capture safety, artifacts, dtypes."""


def test_default_painn_keeps_its_parameters_and_the_mlp_adds_its_own():
    plain = {k: v.shape for k, v in build("PAINN").state_dict().items()}
    radial = {k: v.shape for k, v in build(RADIAL).state_dict().items()}
    assert not any(".radial." in k for k in plain)
    added = {k for k in radial if k not in plain}
    assert added and all(".radial." in k for k in added)
    filters = [k for k in radial if k.endswith("filter.weight")]
    assert filters and all(radial[k][1] == 8 for k in filters)  # the filter reads the MLP's 8 features


def test_the_filter_reads_the_mlp_output():
    """Zeroing the MLP's last linear layer leaves SiLU(bias) constant over edges: the energy then no
    longer depends on the basis beyond the envelope, so it changes from the trained-looking model."""
    model = build(RADIAL).double()
    batch = collate(periodic_samples(CUTOFF)[:2])
    before = model(batch.clone())["energy"].detach()
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.radial[2].weight.zero_()
    after = model(batch.clone())["energy"].detach()
    assert not torch.allclose(before, after)


def test_a_non_positive_width_is_refused():
    with pytest.raises(ModelConfigError, match="radial_mlp"):
        build("PAINN", radial_mlp=0)
