"""``run_training`` in-process: a multi-head graph task in fp64, resumed through the pipeline."""

from __future__ import annotations

import json

import torch
from train_helpers import config

from hydragnn.models import load_artifact
from hydragnn.train.pipeline import run_training, split_indices


def test_split_is_deterministic_and_complete():
    a = split_indices(20, (0.6, 0.2, 0.2), seed=3)
    assert a == split_indices(20, (0.6, 0.2, 0.2), seed=3)
    assert sorted(a[0] + a[1] + a[2]) == list(range(20)) and [len(x) for x in a] == [12, 4, 4]


def test_graph_task_fp64_and_resume(tmp_path):
    cfg = config("graph", n=12, epochs=1, precision="fp64", Checkpoint={"every": 1})
    first = run_training(cfg, tmp_path)
    assert first["epochs_run"] == 1
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = 2
    second = run_training(cfg, tmp_path, resume=True)
    assert [h["epoch"] for h in second["history"]] == [0, 1]
    assert second["history"][0] == first["history"][0]
    model = load_artifact(tmp_path / "model.hydra")
    assert model.dtype == torch.float64
    assert model.manifest["extra"]["best_epoch"] == second["best_epoch"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["NeuralNetwork"]["Architecture"]["precision"] == "fp64"
    assert set(second["test"]["mae"]) == {"energy_per_atom", "au_fraction"}
    assert (tmp_path / "parity_au_fraction.png").stat().st_size > 1000
