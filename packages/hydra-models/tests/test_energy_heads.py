"""Several energy heads on one encoder: config, per-structure head selection, forces of the own
head, per-head references, weighted losses, artifacts, and the shared conformance suite."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import ModelConfig, ModelConfigError, ModelError, load_artifact, save_artifact
from hydragnn.models.testing import CUTOFF, EncoderConformance, build, register_variant
from hydragnn.models.testing.graphs import collate, periodic_samples

HEADS = [
    {"name": "dft_a", "reference_energies": {"Cu": -1.0, "Au": 0.5}, "energy_shift": 0.3, "energy_scale": 2.0},
    {"name": "dft_b", "reference_energies": {"Cu": 2.0, "Au": -0.5}},
]
SUBJECT = register_variant("SchNet+energy_heads", mpnn_type="SchNet", energy_heads=HEADS)


@pytest.mark.parametrize("encoder_name", [SUBJECT])
class TestEnergyHeadsConformance(EncoderConformance):
    """Invariance, forces vs finite differences, batching, padding, capture safety, artifacts, dtypes."""


def _batch(heads):
    batch = collate(periodic_samples(CUTOFF)[: len(heads)])
    batch.head = torch.tensor(heads)
    return batch


def test_each_structure_uses_its_own_head():
    model = build(SUBJECT)
    heads = [0, 1, 1, 0]
    batch = _batch(heads)
    mixed = model(batch)
    for k, name in enumerate(("dft_a", "dft_b")):
        model.select_head(name)
        alone = model(collate(periodic_samples(CUTOFF)[:4]))  # no head attribute: the selected one
        rows = [i for i, h in enumerate(heads) if h == k]
        nodes = torch.cat([torch.arange(int(batch.ptr[i]), int(batch.ptr[i + 1])) for i in rows])
        torch.testing.assert_close(mixed["energy"][rows], alone["energy"][rows])
        torch.testing.assert_close(mixed["forces"][nodes], alone["forces"][nodes])  # forces of the own head
    with pytest.raises(ModelError, match=r"energy head 'dft_c': this model has \['dft_a', 'dft_b'\]"):
        model.select_head("dft_c")


def test_references_shift_and_scale_are_per_head():
    """Two heads that share the readout column give energies that differ by the per-head affine maps."""
    model = build(SUBJECT)
    with torch.no_grad():
        last = model.energy_head.atom.net[-1]
        last.weight[1].copy_(last.weight[0])
        last.bias[1].copy_(last.bias[0])
    a, b = model(_batch([0] * 3)), model(_batch([1] * 3))
    z = collate(periodic_samples(CUTOFF)[:3]).atomic_number.view(-1)
    ref_a = torch.where(z == 29, -1.0, 0.5).unsqueeze(-1)
    ref_b = torch.where(z == 29, 2.0, -0.5).unsqueeze(-1)
    raw = (a["atomic_energy"] - ref_a - 0.3) / 2.0  # head a: shift 0.3, scale 2
    torch.testing.assert_close(b["atomic_energy"], raw + ref_b, rtol=1e-5, atol=1e-5)  # head b: shift 0, scale 1


def test_single_head_layout_is_unchanged():
    one = build("SchNet", reference_energies={"29": -1.0, "79": 0.5})
    named = build("SchNet", reference_energies={"29": -1.0, "79": 0.5}, energy_heads=["only"])
    assert one.state_dict().keys() == named.state_dict().keys()
    assert one.energy_head.reference.shape == (80,) and one.energy_head_names == ["default"]
    two = build(SUBJECT)
    assert two.energy_head.reference.shape == (2, 80) and two.energy_head.atom.net[-1].out_features == 2
    assert "energy_head.shifts" not in two.state_dict()  # config constants, not weights


def test_head_weights_weigh_structures_in_the_loss():
    """Weights [1, 0]: the loss of a mixed batch is the loss of its head-0 structures alone."""
    model = build(SUBJECT)
    batch = _batch([0, 1, 0, 1])
    model.head_weights = torch.tensor([1.0, 0.0])
    _, only_a = model.loss(model(batch), batch)
    sub = collate([periodic_samples(CUTOFF)[i] for i in (0, 2)])
    sub.head = torch.tensor([0, 0])
    model.head_weights = None
    _, plain_a = model.loss(model(sub), sub)
    for name in ("energy", "forces", "atomic_energy", "gap"):
        torch.testing.assert_close(only_a[name], plain_a[name], rtol=1e-5, atol=1e-7)


def test_artifact_keeps_the_heads(tmp_path):
    model = build(SUBJECT)
    batch = _batch([1, 0])
    path = save_artifact(model, tmp_path / "m.hydra", species=[29, 79])
    loaded = load_artifact(path)
    assert loaded.energy_head_names == ["dft_a", "dft_b"]
    torch.testing.assert_close(loaded(batch)["energy"], model(batch)["energy"])


@pytest.mark.parametrize(
    ("heads", "match"),
    [
        ([], "energy_heads: expected a non-empty list"),
        (["a", "a"], r"energy_heads: head names must be unique, found \['a'\]"),
        ([{"name": ""}], r"energy_heads\[0\]\.name: expected a non-empty string"),
        ([{"name": "a", "scale": 1}], r"energy_heads\[0\]\.scale: unknown key; allowed"),
        ([{"name": "a", "energy_scale": 0}], r"energy_heads\[0\]\.energy_scale: expected a finite number > 0"),
        ([{"name": "a", "reference_energies": {"Qq": 1.0}}], r"energy_heads\[0\]\.reference_energies: 'Qq'"),
        ([3], r"energy_heads\[0\]: expected a name or an object"),
    ],
)
def test_energy_heads_config_errors(heads, match):
    arch = {"mpnn_type": "SchNet", "enable_interatomic_potential": True, "energy_heads": heads}
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_dict(arch)
    with pytest.raises(ModelConfigError, match="energy_heads: only for interatomic potentials"):
        ModelConfig.from_dict({"mpnn_type": "SchNet", "energy_heads": ["a"]})
