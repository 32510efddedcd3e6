"""Run folders: never overwritten silently, writable before any work, resumed only under the same
meaning; the CLI answers --help / --version without loading torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from train_helpers import config

from hydragnn.train import CheckpointError, ConfigError
from hydragnn.train.checkpoint import atomic_save
from hydragnn.train.pipeline import run_training
from hydragnn.train.run_folder import fingerprint


def test_a_finished_run_is_not_overwritten_silently(tmp_path):
    cfg = config("graph", n=8, epochs=1)
    run_training(cfg, tmp_path, verbosity=0)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds a finished run \(model\.hydra, metrics\.json.*pass --overwrite"):
        run_training(cfg, tmp_path, verbosity=0)
    before = (tmp_path / "model.hydra").stat().st_mtime_ns
    run_training(cfg, tmp_path, verbosity=0, overwrite=True)
    assert (tmp_path / "model.hydra").stat().st_mtime_ns != before
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only run files are replaced
    with pytest.raises(ConfigError, match="give one"):
        run_training(cfg, tmp_path, resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="nothing to resume"):
        run_training(cfg, tmp_path / "empty", resume=True)


def test_resume_refuses_a_config_that_changed_the_meaning(tmp_path):
    cfg = config("graph", n=8, epochs=1)
    run_training(cfg, tmp_path, verbosity=0)
    changed = config("graph", n=8, epochs=2)
    changed["NeuralNetwork"]["Training"]["Optimizer"]["learning_rate"] = 0.02
    changed["NeuralNetwork"]["Training"]["batch_size"] = 2
    saved = (tmp_path / "config.json").read_text()
    with pytest.raises(CheckpointError) as err:
        run_training(changed, tmp_path, resume=True, verbosity=0)
    msg = str(err.value)
    assert "NeuralNetwork.Training.Optimizer.learning_rate: 0.01 -> 0.02" in msg
    assert "NeuralNetwork.Training.batch_size: 4 -> 2" in msg and "num_epoch" not in msg
    assert (tmp_path / "config.json").read_text() == saved  # nothing rewritten
    more = run_training(config("graph", n=8, epochs=2), tmp_path, resume=True, verbosity=0)
    assert more["epochs_run"] == 2  # the epoch count may change


def test_fingerprint_drops_the_free_keys():
    cfg = config("graph")
    a = fingerprint(cfg)
    cfg["Verbosity"]["level"] = 4
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = 99
    cfg["Dataset"]["name"] = "other"
    assert fingerprint(cfg) == a
    cfg["NeuralNetwork"]["Architecture"]["hidden_dim"] = 16
    assert fingerprint(cfg)["NeuralNetwork.Architecture.hidden_dim"] == 16
    files = [{"path": "/d/train.xyz", "entry": "/d/.hydragnn_cache/train.xyz.0123"}]
    assert fingerprint(cfg, files)["data[0] train.xyz"] == "train.xyz.0123"


def test_unwritable_run_folder_fails_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="the run folder cannot be written"):
        run_training(config("graph", n=100000), blocker / "run")  # 100k structures would take minutes


def test_a_checkpoint_that_is_no_training_checkpoint(tmp_path):
    run_training(config("graph", n=8, epochs=1), tmp_path, verbosity=0)
    atomic_save({"weights": torch.zeros(2)}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        run_training(config("graph", n=8, epochs=2), tmp_path, resume=True, verbosity=0)


def test_help_and_version_do_not_load_torch():
    code = (
        "import sys\n"
        "from hydragnn.train.cli import train_main\n"
        "try:\n    train_main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'torch_geometric', 'ase') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("hydra-train ") and lines[-1] == "[]"
