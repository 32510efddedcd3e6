"""``Architecture.committee`` through the trainer: a committee of interatomic potentials trains,
resumes, and writes one artifact that serves the members' mean; fine-tuning one is refused."""

from __future__ import annotations

import pytest
import torch
from train_helpers import config

from hydragnn.models import Committee, load_artifact
from hydragnn.train import ConfigError
from hydragnn.train.config import load_config
from hydragnn.train.pipeline import run_training


def _committee_config(epochs: int, **training) -> dict:
    cfg = config("mlip", n=12, epochs=epochs, **training)
    cfg["NeuralNetwork"]["Architecture"]["committee"] = 2
    return cfg


def test_committee_trains_resumes_and_serves_the_mean(tmp_path):
    first = run_training(_committee_config(1, Checkpoint={"every": 1}), tmp_path)
    cfg = _committee_config(2, Checkpoint={"every": 1})
    second = run_training(cfg, tmp_path, resume=True)
    assert [h["epoch"] for h in second["history"]] == [0, 1]
    assert second["history"][0] == first["history"][0]
    model = load_artifact(tmp_path / "model.hydra")
    assert isinstance(model, Committee) and len(model.members) == 2
    a, b = (dict(m.named_parameters()) for m in model.members)
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert second["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert set(second["test"]["mae"]) >= {"energy", "forces"}


def test_a_committee_is_fine_tuned_member_by_member(tmp_path):
    """Each member starts from the artifact's own member (a frozen trunk stays that member's); the
    committee size comes from the artifact when the run's Architecture leaves it out, and another
    size is refused naming the key."""
    base = tmp_path / "base"
    run_training(_committee_config(1), base)
    trained = load_artifact(base / "model.hydra")
    cfg = config("mlip", n=12, epochs=1, init_from=str(base / "model.hydra"), FineTune={"freeze_encoder": True})
    cfg["NeuralNetwork"]["Architecture"].pop("committee", None)
    assert load_config(cfg).model_config.committee == 2
    run_training(cfg, tmp_path / "tuned")
    tuned = load_artifact(tmp_path / "tuned" / "model.hydra")
    for k in range(2):
        mine, theirs = tuned.members[k].encoder.state_dict(), trained.members[k].encoder.state_dict()
        assert all(torch.equal(mine[key], theirs[key]) for key in mine)
    cfg["NeuralNetwork"]["Architecture"]["committee"] = 3
    with pytest.raises(ConfigError, match="2 committee member.*Architecture.committee to 2"):
        run_training(cfg, tmp_path / "other")
