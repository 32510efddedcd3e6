"""GPS models in hydra-train: the ``global_attn_redraw_interval`` key, performer redraws exactly
at the interval (also under activation checkpointing, never in evaluation), the redraw counter
across resume, and a GPS model with positional encodings trained end to end and reloaded."""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import GRAPH_ARCH, GRAPH_VARIABLES, config, params, samples

from hydragnn.data import Schema, open_dataset
from hydragnn.models import build_model, load_artifact, redraw_projections
from hydragnn.models.attention import PerformerAttention
from hydragnn.train import ConfigError, create_dataloaders, train_validate_test
from hydragnn.train.config import load_config, parse_training
from hydragnn.train.pipeline import run_training
from hydragnn.train.predict import predict

PERFORMER = {**GRAPH_ARCH, "global_attn_engine": "GPS", "global_attn_type": "performer", "global_attn_heads": 2}


# ----------------------------------------------------------------------------- config
def test_redraw_interval_key_is_validated():
    assert parse_training({}).global_attn_redraw_interval == 1000
    assert parse_training({"global_attn_redraw_interval": None}).global_attn_redraw_interval is None
    assert parse_training({"global_attn_redraw_interval": 5}).to_dict()["global_attn_redraw_interval"] == 5
    for bad, match in (
        (0, "expected a value >= 1"),
        (2.5, "expected int"),
        (True, "expected int"),
        ("10", "expected int"),
    ):
        with pytest.raises(ConfigError, match=rf"NeuralNetwork\.Training\.global_attn_redraw_interval: {match}"):
            parse_training({"global_attn_redraw_interval": bad})
    cfg = load_config(config(global_attn_redraw_interval=7))
    assert load_config(cfg.to_dict()).training.global_attn_redraw_interval == 7


# ----------------------------------------------------------------------------- redraw schedule
def _build(arch: dict, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(arch, Schema.from_dict(GRAPH_VARIABLES))


def _performers(model) -> list[PerformerAttention]:
    return [m for m in model.modules() if isinstance(m, PerformerAttention)]


def _train_recording(arch: dict, n_train: int, epochs: int = 1, run_dir=None, resume=False, **training):
    """Train with batch size 1; record the first performer projection before every forward."""
    data = samples("graph", 12)
    train, val, _ = create_dataloaders(data[:n_train], data[n_train : n_train + 2], None, 1)
    model = _build(arch)
    seen: list[tuple[bool, torch.Tensor]] = []
    performers = _performers(model)
    model.register_forward_pre_hook(
        lambda module, args: seen.append((module.training, performers[0].projection.clone())) if performers else None
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config(epochs=epochs, **training)["NeuralNetwork"]
    summary = train_validate_test(
        model, optimizer, train, val, None, None, None, nn_config, "gps", 0, run_dir=run_dir, resume=resume
    )
    return model, summary, seen


@pytest.mark.parametrize("checkpointing", [False, True])
def test_performer_redraws_exactly_at_the_interval(tmp_path, checkpointing):
    arch = {**PERFORMER, "conv_checkpointing": checkpointing}
    model, summary, seen = _train_recording(arch, 7, run_dir=tmp_path, global_attn_redraw_interval=3, seed=5)
    assert summary["train_batches"] == 7 and summary["projection_redraws"] == 2
    train_proj = [p for training, p in seen if training]
    eval_proj = [p for training, p in seen if not training]
    assert len(train_proj) == 7 and len(eval_proj) >= 2
    changed = [i for i in range(1, 7) if not torch.equal(train_proj[i], train_proj[i - 1])]
    assert changed == [3, 6], f"projection changed before batches {changed}, expected [3, 6]"
    reference = _build(arch)
    initial = _performers(reference)[0].projection.clone()
    assert torch.equal(train_proj[0], initial), "no redraw before the first batch"
    for count, batch_index in ((1, 3), (2, 6)):
        redraw_projections(reference, seed=5, count=count)
        assert torch.equal(train_proj[batch_index], _performers(reference)[0].projection)
    assert all(torch.equal(p, train_proj[-1]) for p in eval_proj[-2:]), "evaluation must not redraw"


def test_no_redraw_when_disabled_or_without_performers(tmp_path):
    _, summary, seen = _train_recording(PERFORMER, 5, run_dir=tmp_path / "a", global_attn_redraw_interval=None)
    assert summary["projection_redraws"] == 0 and summary["train_batches"] == 5
    assert all(torch.equal(p, seen[0][1]) for _, p in seen)
    multihead = {**PERFORMER, "global_attn_type": "multihead"}
    _, summary, _ = _train_recording(multihead, 5, run_dir=tmp_path / "b", global_attn_redraw_interval=1)
    assert summary["projection_redraws"] == 0 and summary["train_batches"] == 5


def test_resume_keeps_the_redraw_count(tmp_path):
    # 4 batches per epoch, interval 3: redraws before batches 3 (epoch 0) and 6 (epoch 1)
    straight, s1, _ = _train_recording(PERFORMER, 4, epochs=2, run_dir=tmp_path / "a", global_attn_redraw_interval=3)
    _train_recording(PERFORMER, 4, epochs=1, run_dir=tmp_path / "b", global_attn_redraw_interval=3)
    resumed, s2, _ = _train_recording(
        PERFORMER, 4, epochs=2, run_dir=tmp_path / "b", resume=True, global_attn_redraw_interval=3
    )
    assert s1["train_batches"] == s2["train_batches"] == 8 and s2["projection_redraws"] == 1
    for key, value in params(straight).items():
        assert torch.equal(value, params(resumed)[key]), key


# ----------------------------------------------------------------------------- end to end
def test_gps_with_positional_encodings_trains_and_reloads(tmp_path):
    cfg = config(epochs=2, global_attn_redraw_interval=2)
    arch = cfg["NeuralNetwork"]["Architecture"]
    arch.update(copy.deepcopy(PERFORMER), pe_dim=3)
    metrics = run_training(cfg, tmp_path / "run")
    assert metrics["epochs_run"] == 2
    history = metrics["history"]
    assert all(torch.isfinite(torch.tensor([h["train_loss"], h["val_loss"]])).all() for h in history)
    model = load_artifact(metrics["paths"]["artifact"])
    assert model.config.attention.pe_dim == 3 and model.config.attention.attn_type == "performer"
    test_set = metrics["paths"]["test_set"]
    stored = open_dataset(test_set)[0]  # the prepared data carries its encodings
    assert stored.lap_pe.shape == stored.rw_pe.shape == (stored.num_nodes, 3)
    report, _, preds = predict(metrics["paths"]["artifact"], test_set, batch_size=2)
    assert report["loss"] == pytest.approx(metrics["test"]["loss"], rel=1e-5)
    for name in preds:
        assert torch.isfinite(preds[name]).all()
