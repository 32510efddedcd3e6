"""``Architecture.committee``: K members served as their mean and trained each on its own loss;
the conformance suite on a committee, the mean and the loss exactly, artifacts and refusals."""

from __future__ import annotations

import pytest
import torch

from hydragnn.models import Committee, HydraModel, ModelConfig, ModelConfigError, load_artifact, save_artifact
from hydragnn.models.committee import MEMBERS_SUFFIX, member_predictions
from hydragnn.models.testing import CUTOFF, EncoderConformance, build, register_variant
from hydragnn.models.testing.graphs import collate, periodic_samples

PAINN = register_variant("PAINN+committee", mpnn_type="PAINN", committee=2)
SCHNET = register_variant("SchNet+committee", mpnn_type="SchNet", committee=3)


@pytest.mark.parametrize("encoder_name", [PAINN, SCHNET])
class TestCommitteeConformance(EncoderConformance):
    """Invariance, forces vs finite differences, batching, padding, capture safety, artifacts, dtypes."""


def _batch():
    return collate(periodic_samples(CUTOFF)[:3])


def test_members_differ_and_the_output_is_their_mean():
    """Members draw their own initial weights; every output (forces and stress included) is the
    mean of the members' own predictions."""
    torch.manual_seed(0)
    model = build(SCHNET)
    assert isinstance(model, Committee) and len(model.members) == 3
    assert all(isinstance(m, HydraModel) and m.config.committee == 1 for m in model.members)
    w = [next(m.encoder.parameters()) for m in model.members]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    batch = _batch()
    model.eval()
    out = model(batch, compute_stress=True)
    each = [m(batch, compute_stress=True) for m in model.members]
    assert {"energy", "forces", "stress"} <= set(out) and not any(k.endswith(MEMBERS_SUFFIX) for k in out)
    for name in out:
        torch.testing.assert_close(out[name], sum(o[name] for o in each) / 3)


def test_training_loss_is_the_mean_of_the_members_losses():
    """In training mode each member is scored on its own prediction (not the committee's mean):
    the loss is the mean of the members' losses, and its gradient reaches each member as that
    member's own loss gradient divided by K."""
    torch.manual_seed(1)
    model = build(PAINN).train()
    batch = _batch()
    buffers = {k: v.clone() for k, v in model.named_buffers() if ".input_norm." in k}
    out = model(batch)
    assert out["energy" + MEMBERS_SUFFIX].shape == (2, *out["energy"].shape)
    total, heads = model.loss(out, batch)
    with torch.no_grad():  # the members' own passes from the same running statistics
        for k, v in model.named_buffers():
            if k in buffers:
                v.copy_(buffers[k])
    singles = [m.loss(m(batch), batch) for m in model.members]
    torch.testing.assert_close(total, (singles[0][0] + singles[1][0]) / 2)
    for name in heads:
        torch.testing.assert_close(heads[name], (singles[0][1][name] + singles[1][1][name]) / 2)
    mean_loss, _ = model.first.loss({k: v for k, v in out.items() if not k.endswith(MEMBERS_SUFFIX)}, batch)
    assert not torch.allclose(total, mean_loss)  # the loss of the mean is another function
    grad = torch.autograd.grad(total, list(model.members[1].parameters()), allow_unused=True)
    own = torch.autograd.grad(singles[1][0], list(model.members[1].parameters()), allow_unused=True)
    for g, o in zip(grad, own):
        if o is not None:
            torch.testing.assert_close(g, o / 2)
    model.eval()
    with torch.no_grad():
        evaluated, _ = model.loss(model(batch), batch)
        mean_out = model(batch)
        torch.testing.assert_close(evaluated, model.first.loss(mean_out, batch)[0])


def test_artifact_keeps_the_committee(tmp_path):
    torch.manual_seed(2)
    model = build(PAINN).eval()
    path = save_artifact(model, tmp_path / "c.hydra")
    loaded = load_artifact(path)
    assert isinstance(loaded, Committee) and len(loaded.members) == 2
    batch = _batch()
    torch.testing.assert_close(loaded(batch)["forces"], model(batch)["forces"])


def test_select_head_and_head_weights_reach_every_member():
    model = build(PAINN)
    model.head_weights = torch.tensor([1.0])
    assert all(m.head_weights is not None for m in model.members)
    with pytest.raises(Exception, match="energy head 'other'"):
        model.select_head("other")


def test_changed_loss_weights_reach_every_members_loss():
    """The second stage reweighs ``model.task_weights``; every member's training loss must follow
    (until 0.2.1 only member 0's did, so the others never fitted the energies in stage two)."""
    torch.manual_seed(3)
    model = build(PAINN).train()
    batch = _batch()
    out = model(batch)
    before = [m.loss(member_predictions(out, k), batch) for k, m in enumerate(model.members)]
    energy = model.special["energy"]
    old = dict(model.task_weights)
    model.task_weights[energy] = old[energy] * 1000.0
    for k, member in enumerate(model.members):
        total, heads = member.loss(member_predictions(out, k), batch)
        torch.testing.assert_close(heads[energy], before[k][1][energy])
        expected = before[k][0] + (1000.0 - 1.0) * old[energy] * heads[energy]
        torch.testing.assert_close(total, expected)


@pytest.mark.parametrize(("value", "message"), [(0, "committee"), (65, "committee"), (2.5, "committee")])
def test_bad_committee_sizes_are_refused(value, message):
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_dict({"mpnn_type": "SchNet", "committee": value})


def test_a_hydra_model_is_one_member():
    config = ModelConfig.from_dict({"mpnn_type": "SchNet", "committee": 2})
    with pytest.raises(ModelConfigError, match="committee"):
        HydraModel(config, build("SchNet").schema)
