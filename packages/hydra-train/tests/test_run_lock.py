"""A run folder is locked while a run works in it: a second run, a second --resume or an
--overwrite is refused naming the holder; a lock left by a killed run is taken over and named;
the lock is gone when the run ends, whether it finished or failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from train_helpers import config

from hydragnn.train import ConfigError
from hydragnn.train.pipeline import run_training
from hydragnn.train.run_folder import LOCK_NAME, RunLock


def test_a_second_run_into_a_busy_folder_is_refused_before_it_touches_anything(tmp_path):
    cfg = config("graph", n=8, epochs=1)
    first = RunLock(tmp_path)  # a run that has not yet written its first checkpoint
    (tmp_path / "config.json").write_text("{}")
    try:
        for kwargs in ({}, {"overwrite": True}):
            with pytest.raises(ConfigError, match=rf"another run is using this folder \(pid {os.getpid()} on host "):
                run_training(cfg, tmp_path, verbosity=0, **kwargs)
        assert (tmp_path / "config.json").read_text() == "{}" and not (tmp_path / "model.hydra").exists()
    finally:
        first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    run_training(cfg, tmp_path, verbosity=0)  # free again
    assert not (tmp_path / LOCK_NAME).exists()  # released after a finished run


def test_two_resumes_of_one_run_are_refused(tmp_path):
    cfg = config("graph", n=8, epochs=1)
    run_training(cfg, tmp_path, verbosity=0)
    with RunLock(tmp_path):  # the first --resume, still working
        with pytest.raises(ConfigError, match="another run is using this folder"):
            run_training(config("graph", n=8, epochs=2), tmp_path, resume=True, verbosity=0)
    assert run_training(config("graph", n=8, epochs=2), tmp_path, resume=True, verbosity=0)["epochs_run"] == 2


def test_a_killed_runs_lock_is_taken_over_and_named(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    holder = {
        "host": os.uname().nodename,
        "pid": pid,
        "start": "1",
        "started_at": "2026-01-01 00:00:00",
        "command": "x",
    }
    (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
    run_training(config("graph", n=8, epochs=1), tmp_path, verbosity=1)
    log = (tmp_path / "train.log").read_text()
    assert f"a stale {LOCK_NAME} of a run that was killed (pid {pid} on host" in log
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_from_another_host_is_refused_with_the_command_to_remove_it(tmp_path):
    holder = {
        "host": "node-17",
        "pid": 4242,
        "start": "9",
        "started_at": "2026-12-06 10:00:00",
        "command": "hydragnn-train c.json",
    }
    (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
    with pytest.raises(ConfigError) as info:
        run_training(config("graph", n=8, epochs=1), tmp_path, verbosity=0)
    message = str(info.value)
    assert "pid 4242 on host node-17, started 2026-12-06 10:00:00: 'hydragnn-train c.json'" in message
    assert f"rm {tmp_path / LOCK_NAME}" in message
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == holder  # not ours to remove


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    cfg = config("graph", n=8, epochs=1)
    cfg["NeuralNetwork"]["Architecture"]["hidden_dim"] = -3
    with pytest.raises(Exception):  # noqa: B017,PT011 (any error of the run: the point is the lock)
        run_training(cfg, tmp_path, verbosity=0)
    assert not (tmp_path / LOCK_NAME).exists()
