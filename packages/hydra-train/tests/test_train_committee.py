"""``Architecture.committee`` through the trainer: a committee of interatomic potentials trains,
resumes, and writes one artifact that serves the members' mean; fine-tuning one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import build, config, samples

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


# "auto": the member count from the time budget (hydragnn.train.committee_size) ---------------


def test_auto_sizes_by_epochs_and_steps_per_member():
    from hydragnn.train.committee_size import MAX_MEMBERS, MIN_EPOCHS, MIN_STEPS, choose_members

    batches = MIN_STEPS // MIN_EPOCHS + 1  # so that MIN_EPOCHS epochs are enough steps
    epoch_s = 1.0 * batches  # 1 s per step, no validation
    assert choose_members(1.0, batches, 0, None, 10_000).members == 1  # no budget to share
    assert choose_members(None, batches, 0, 3600.0, 10_000).members == 1
    budget = MAX_MEMBERS * MIN_EPOCHS * epoch_s
    assert choose_members(1.0, batches, 0, budget, 10_000).members == MAX_MEMBERS
    assert choose_members(1.0, batches, 0, budget * 0.99, 10_000).members == MAX_MEMBERS - 1
    assert choose_members(1.0, batches, 0, 2 * MIN_EPOCHS * epoch_s * 0.99, 10_000).members == 1
    # the epoch cap bounds what a member gets, however large the budget
    assert choose_members(1.0, batches, 0, 1e9, MIN_EPOCHS - 1).members == 1
    # validation batches count against the budget
    assert choose_members(1.0, batches, 2 * batches, budget, 10_000).members < MAX_MEMBERS
    # many batches per epoch: the epochs decide; few: the steps decide
    few = max(1, MIN_STEPS // MIN_EPOCHS // 4)
    assert choose_members(1.0, few, 0, MAX_MEMBERS * MIN_EPOCHS * few, 10_000).members == 1
    assert choose_members(1.0, few, 0, MAX_MEMBERS * MIN_STEPS * 1.0, 10_000).members == MAX_MEMBERS


def test_time_train_step_leaves_the_random_state():
    from hydragnn.data.loaders import create_dataloaders
    from hydragnn.train.committee_size import time_train_step
    from hydragnn.train.strategies import build_optimizer_factory

    loader = create_dataloaders(samples("mlip", n=8), None, None, 4)[0]
    model, factory = build("mlip"), build_optimizer_factory({"type": "Adam", "learning_rate": 0.01})
    state = torch.get_rng_state()
    seconds = time_train_step(model, loader, factory, torch.device("cpu"), steps=3, warmup=1)  # cycles 2 batches
    assert seconds > 0 and torch.equal(state, torch.get_rng_state())
    with pytest.raises(ValueError, match="no batches"):
        time_train_step(model, [], factory, torch.device("cpu"))


def test_auto_committee_is_resolved_recorded_and_kept_on_resume(tmp_path, monkeypatch):
    """The MLIP default ``"auto"``: with a budget that buys every member enough epochs the run
    trains three members and records the count (config.json, artifact); a resumed run keeps the
    recorded count though the rule would now choose one; without a budget it is one model."""
    from hydragnn.train import committee_size

    monkeypatch.setattr(committee_size, "MIN_EPOCHS", 1)
    monkeypatch.setattr(committee_size, "MIN_STEPS", 1)
    cfg = config("mlip", n=12, epochs=1, max_time_s=3600, Checkpoint={"every": 1})
    cfg["NeuralNetwork"]["Architecture"].pop("committee", None)
    cfg["Verbosity"]["level"] = 1  # the log says what was chosen and why
    parsed = load_config(cfg)
    assert parsed.auto_committee and parsed.model_config.committee == 1
    assert "Architecture.committee" in parsed.mlip_defaults
    first = run_training(cfg, tmp_path)
    model = load_artifact(tmp_path / "model.hydra")
    assert isinstance(model, Committee) and len(model.members) == committee_size.MAX_MEMBERS
    saved = load_config(tmp_path / "config.json")
    assert saved.model_config.committee == committee_size.MAX_MEMBERS and not saved.auto_committee
    assert "committee auto: 3 members: a training step takes" in Path(first["paths"]["log"]).read_text()

    monkeypatch.setattr(committee_size, "MIN_EPOCHS", 10**9)
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = 2
    second = run_training(cfg, tmp_path, resume=True)
    assert [h["epoch"] for h in second["history"]] == [0, 1]
    assert len(load_artifact(tmp_path / "model.hydra").members) == committee_size.MAX_MEMBERS

    plain = config("mlip", n=12, epochs=1)
    plain["NeuralNetwork"]["Architecture"].pop("committee", None)
    run_training(plain, tmp_path / "plain")
    assert not isinstance(load_artifact(tmp_path / "plain" / "model.hydra"), Committee)


def test_a_resumed_auto_committee_needs_the_recorded_count(tmp_path):
    import json

    from hydragnn.train.committee_size import stored_members

    with pytest.raises(ValueError, match="config.json: no committee size recorded"):
        stored_members(tmp_path)
    section = {"NeuralNetwork": {"Architecture": {"committee": "auto"}}}
    (tmp_path / "config.json").write_text(json.dumps(section))
    with pytest.raises(ValueError, match="committee is 'auto', not a member count"):
        stored_members(tmp_path)
    section["NeuralNetwork"]["Architecture"]["committee"] = 2
    (tmp_path / "config.json").write_text(json.dumps(section))
    assert stored_members(tmp_path) == 2
