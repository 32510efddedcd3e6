"""``energy_layer_readout``: every conv layer but the last adds a linear per-atom energy; the
conformance suite on two encoders, the readout's exact contribution, and the refusals."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import ModelConfig, ModelConfigError
from hydragnn.models.testing import CUTOFF, EncoderConformance, build, register_variant
from hydragnn.models.testing.graphs import collate, periodic_samples

PAINN = register_variant("PAINN+energy_layer_readout", mpnn_type="PAINN", energy_layer_readout=True)
SCHNET = register_variant("SchNet+energy_layer_readout", mpnn_type="SchNet", energy_layer_readout=True)
MACE = register_variant("MACE+energy_layer_readout", mpnn_type="MACE", energy_layer_readout=True)


@pytest.mark.parametrize("encoder_name", [PAINN, SCHNET])
class TestLayerReadoutConformance(EncoderConformance):
    """Invariance, forces vs finite differences, batching, padding, capture safety, artifacts, dtypes."""


def _batch():
    return collate(periodic_samples(CUTOFF)[:3])


@pytest.mark.parametrize("name", [PAINN, SCHNET, MACE])
def test_each_layer_adds_its_linear_energy(name):
    """With the readouts zeroed the model is the plain one (same weights otherwise); one readout's
    weight adds exactly ``scale * w . h_l`` per atom, with ``h_l`` that layer's invariant output."""
    model = build(name)
    layers = model.energy_head.layers
    assert len(layers) == model.config.num_conv_layers - 1
    plain = build(name.split("+")[0])
    missing = plain.load_state_dict(model.state_dict(), strict=False)
    assert sorted(missing.unexpected_keys) == [f"energy_head.layers.{i}.weight" for i in range(len(layers))]
    batch = _batch()
    with torch.no_grad():
        for readout in layers:
            readout.weight.zero_()
        torch.testing.assert_close(model(batch)["atomic_energy"], plain(batch)["atomic_energy"])
        base = model(batch)["atomic_energy"]
        layers[0].weight.normal_()
        inputs = model.graph_inputs(batch, batch.pos, batch.edge_index, getattr(batch, "edge_shift", None))
        inputs.layer_features = []
        model.encode(inputs)
        assert len(inputs.layer_features) == model.config.num_conv_layers
        expected = base + model.energy_head.scale * inputs.layer_features[0] @ layers[0].weight.T
    torch.testing.assert_close(model(batch)["atomic_energy"], expected, rtol=1e-5, atol=1e-6)


def test_one_layer_has_no_readout():
    assert build(PAINN, num_conv_layers=1).energy_head.layers is None
    assert build("PAINN").energy_head.layers is None


@pytest.mark.parametrize(
    ("arch", "message"),
    [
        ({"mpnn_type": "DimeNet"}, "energy_layer_readout: .*DimeNet has no per-layer node state"),
        ({"mpnn_type": None, "global_attn_engine": "EquivariantTransformer"}, "standalone EquivariantTransformer"),
        ({"mpnn_type": "PAINN", "enable_interatomic_potential": False}, "only for interatomic potentials"),
    ],
)
def test_refused_where_there_is_no_layer_to_read(arch, message):
    raw = {"hidden_dim": 8, "num_conv_layers": 2, "enable_interatomic_potential": True, "energy_layer_readout": True}
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_dict({**raw, **arch})


def test_every_encoder_that_accepts_the_key_reports_its_layers():
    """An encoder the config lets take ``energy_layer_readout`` must report every conv layer's
    features, else the key passes the config and fails in training (MACE did)."""
    from hydragnn.models.encoders import ENCODERS

    batch = _batch()
    accepted = []
    for name in sorted(ENCODERS):
        try:
            model = build(name, energy_layer_readout=True)
        except ModelConfigError as exc:
            assert "energy_layer_readout" in str(exc) or "interatomic" in str(exc), (name, str(exc))
            continue
        accepted.append(name)
        with torch.no_grad():
            out = model(batch)
        assert torch.isfinite(out["energy"]).all(), name
    assert {"MACE", "PAINN", "SchNet"} <= set(accepted)
