"""The composition baseline and the warning when a potential's energies sit at it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from train_helpers import config

from hydragnn.train.energy_check import (
    composition_baseline,
    energy_warnings,
    force_warnings,
    zero_force_baseline,
)
from hydragnn.train.pipeline import run_training


def _molecule(numbers, energy):
    return Data(
        atomic_number=torch.tensor(numbers).reshape(-1, 1), energy=torch.tensor([[energy]], dtype=torch.float64)
    )


def test_baseline_is_the_least_squares_composition_fit_on_validation():
    rng = np.random.default_rng(0)
    e0 = {1: -13.6, 8: -432.0}
    train, val = [], []
    for k in range(12):
        numbers = [1] * int(rng.integers(1, 5)) + [8] * int(rng.integers(1, 3))
        (train if k < 8 else val).append(_molecule(numbers, sum(e0[z] for z in numbers) + rng.normal(0, 0.3)))
    counts = np.array([[sum(int(z) == e for z in s.atomic_number.reshape(-1)) for e in (1, 8)] for s in train], float)
    fit, *_ = np.linalg.lstsq(counts, np.array([float(s.energy) for s in train]), rcond=None)
    expected = np.mean(
        [
            abs(float(s.energy) - fit @ [sum(int(z) == e for z in s.atomic_number.reshape(-1)) for e in (1, 8)])
            / s.atomic_number.numel()
            for s in val
        ]
    )
    assert composition_baseline(train, val, "energy") == pytest.approx(expected, rel=1e-9)
    assert composition_baseline(train, None, "energy") is None
    assert composition_baseline(train, [_molecule([6], -5.0)], "energy") is None  # carbon never trained on


def _history(maes):
    return [{"epoch": k, "val_errors": {"energy": {"mae": m}}} for k, m in enumerate(maes)]


def test_warnings_name_the_first_stage_and_the_final_model():
    stuck_then_learned = _history([0.5, 0.45, 0.44, 0.01, 0.008])
    (first,) = energy_warnings(stuck_then_learned, best_epoch=4, second_stage_epoch=3, baseline=0.07)
    assert "first stage ended (epoch 2)" in first and "0.44" in first and "energy_weight" in first
    never = energy_warnings(_history([0.5, 0.45, 0.44]), best_epoch=2, second_stage_epoch=None, baseline=0.07)
    assert len(never) == 1 and "not learned" in never[0]
    assert energy_warnings(_history([0.5, 0.05, 0.01]), 2, 2, baseline=0.07) == []
    assert energy_warnings(_history([0.5]), 0, None, baseline=None) == []


def test_a_run_that_never_weighs_energy_warns_and_records_the_baseline(tmp_path, capsys):
    """Energy weight 0: the forces train, the energies do not; the run says so."""
    cfg = config("mlip", n=16, epochs=2)
    arch = cfg["NeuralNetwork"]["Architecture"]
    del arch["task_weights"]
    arch.update(energy_weight=0.0, forces_weight=1.0)
    cfg["Verbosity"]["level"] = 1
    run_training(cfg, tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    baseline = metrics["composition_baseline_energy_mae"]
    assert baseline is not None and baseline > 0
    best = metrics["history"][metrics["best_epoch"]]["val_errors"]["energy"]["mae"]
    assert best >= baseline
    assert "no better than composition alone" in capsys.readouterr().out


def test_zero_force_baseline_and_its_warning():
    """The zero-force MAE is the mean |F| component of the validation set; a kept model at or
    above 80 % of it is named, one below is not."""
    val = [Data(forces=torch.tensor([[1.0, -2.0, 0.0]])), Data(forces=torch.tensor([[3.0, 0.0, 0.0], [0, 0, 0]]))]
    assert zero_force_baseline(val, "forces") == pytest.approx(6.0 / 9.0)
    assert zero_force_baseline(val, "other") is None and zero_force_baseline([], "forces") is None
    history = [
        {"epoch": 0, "val_errors": {"forces": {"mae": 0.6}}},
        {"epoch": 1, "val_errors": {"forces": {"mae": 0.2}}},
    ]
    (line,) = force_warnings(history, best_epoch=0, baseline=0.7)
    assert "86% of what predicting zero forces gives" in line and "epoch 0" in line
    assert force_warnings(history, best_epoch=1, baseline=0.7) == []


def test_a_run_whose_forces_did_not_move_warns(tmp_path, capsys):
    """A learning rate too small to change anything: the kept model's forces are the initial
    model's, no better than zero, and the run says so."""
    cfg = config("mlip", n=16, epochs=1)
    cfg["NeuralNetwork"]["Training"]["Optimizer"]["learning_rate"] = 1e-12
    cfg["Verbosity"]["level"] = 1
    run_training(cfg, tmp_path)
    assert "its forces are barely learned" in capsys.readouterr().out
