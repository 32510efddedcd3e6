"""Run folders: never overwritten silently, writable before any work, resumed only under the same
meaning, with a log of every segment and a time budget for the whole run; the CLI answers
--help / --version without loading torch."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings

import pytest
import torch
from train_helpers import config

from hydragnn.train import CheckpointError, ConfigError
from hydragnn.train import pipeline as pipeline_module
from hydragnn.train.checkpoint import atomic_save, load_checkpoint
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
    files = [{"path": "/d/train.xyz", "entry": "/d/.hydragnn_cache/train.xyz.4567", "sha256": "ab" * 32}]
    assert fingerprint(cfg, files)["data[0] train.xyz"] == "ab" * 32  # the content, whatever the entry


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


def test_the_run_folder_holds_the_log_of_the_run(tmp_path, capsys, monkeypatch):
    """train.log: every console line once, the warnings, no live bar; the level follows the
    verbosity; a resume appends, an overwrite starts afresh; nothing stays attached."""
    top = logging.getLogger("hydragnn")
    before = (list(top.handlers), top.level, list(logging.getLogger().handlers), logging.getLogger().level)
    original = pipeline_module.fill_data_statistics

    def noisy(*args):
        warnings.warn("a warning raised during the run", UserWarning, stacklevel=1)
        return original(*args)

    monkeypatch.setattr(pipeline_module, "fill_data_statistics", noisy)
    monkeypatch.setenv("HYDRAGNN_PROGRESS", "bar")
    shown: list[str] = []  # what Python's warning display received (the console)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        display = warnings.showwarning
        run_training(config("graph", n=8, epochs=1), tmp_path, verbosity=2)
        assert warnings.showwarning is display and shown == ["a warning raised during the run"]
    out = capsys.readouterr().out
    log = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert "%|" in out and "%|" not in log  # the live bar stays on the console
    printed = [line for line in out.splitlines() if line.strip() and "%|" not in line]
    assert printed and all(line in log for line in printed), printed
    assert "UserWarning: a warning raised during the run" in log
    assert "epoch 0: loss train" in log and "best epoch 0" in log and "test loss" in log
    assert out.count("best epoch") == 1 and out.count("test loss") == 1  # each fact printed once
    assert len([line for line in printed if line.lstrip().startswith("au_fraction ")]) == 1
    assert json.loads((tmp_path / "metrics.json").read_text())["paths"]["log"] == str(tmp_path / "train.log")

    with warnings.catch_warnings():
        warnings.showwarning = lambda *args, **kwargs: None
        run_training(config("graph", n=8, epochs=2), tmp_path, resume=True, verbosity=1)
    assert "epoch 1:" not in capsys.readouterr().out
    resumed = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert resumed.startswith(log) and "resumed from" in resumed[len(log) :]
    assert "epoch 1:" not in resumed  # verbosity 1: no epoch lines in the log either

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda *args, **kwargs: None
        run_training(config("graph", n=8, epochs=1), tmp_path, overwrite=True, verbosity=0)
    assert capsys.readouterr().out == ""
    quiet = (tmp_path / "train.log").read_text(encoding="utf-8")  # verbosity 0: the warning (and its source line)
    assert quiet.count(" WARNING ") == 1 and "UserWarning: a warning raised during the run" in quiet
    assert " INFO " not in quiet and "resumed from" not in quiet
    assert (list(top.handlers), top.level, list(logging.getLogger().handlers), logging.getLogger().level) == before


def test_max_time_s_is_the_budget_of_the_whole_run(tmp_path, capsys):
    """A resume trains only for what is left of ``max_time_s``; one with nothing left says so,
    trains nothing and still writes its outputs. The time used only grows."""
    ckpt_path = tmp_path / "checkpoint.pt"
    spent = config("graph", n=8, epochs=3, max_time_s=1e-3)
    first = run_training(spent, tmp_path, verbosity=1)
    assert first["epochs_run"] == 1 and first["stop_reason"] == "max_time_s"
    used = load_checkpoint(ckpt_path)["train_time_s"]
    assert used > 1e-3 and first["train_time_s"] >= used
    capsys.readouterr()

    again = run_training(spent, tmp_path, resume=True, verbosity=1)
    out = capsys.readouterr().out
    assert "time budget spent" in out and "raise NeuralNetwork.Training.max_time_s to train more" in out
    assert again["epochs_run"] == 1 and again["stop_reason"] == "max_time_s" and again["best_epoch"] == 0
    assert load_checkpoint(ckpt_path)["train_time_s"] == used  # nothing trained, nothing rewritten
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["stop_reason"] == "max_time_s" and metrics["test"]["mae"] and (tmp_path / "model.hydra").is_file()

    ckpt = load_checkpoint(ckpt_path)
    ckpt["train_time_s"] = 100.0  # as if the first segment had trained 100 s
    atomic_save(ckpt, ckpt_path)
    more = run_training(config("graph", n=8, epochs=3, max_time_s=150.0), tmp_path, resume=True, verbosity=1)
    assert "after epoch 0 (100.0 s trained; 50.0 s of max_time_s left)" in capsys.readouterr().out
    assert more["epochs_run"] == 3 and more["stop_reason"] == "num_epoch"
    stored = load_checkpoint(ckpt_path)
    assert 100.0 < stored["train_time_s"] <= more["train_time_s"]

    del stored["train_time_s"]  # a checkpoint of an older version: the epochs' own seconds count
    atomic_save(stored, ckpt_path)
    run_training(config("graph", n=8, epochs=3, max_time_s=150.0), tmp_path, resume=True, verbosity=1)
    seconds = sum(h["seconds"] for h in stored["history"])
    assert (
        f"after epoch 2 ({seconds:.1f} s trained; {150 - seconds:.1f} s of max_time_s left)" in capsys.readouterr().out
    )


def test_resume_help_says_the_budget_spans_the_run(capsys):
    from hydragnn.train.cli import train_main

    with pytest.raises(SystemExit):
        train_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "train.log" in text and "Training.max_time_s is the budget of the whole run" in text
