"""``hydragnn-train`` and ``hydragnn-predict`` end to end, in subprocesses (with timeouts)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from train_helpers import config

TIMEOUT_S = 240


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def test_train_then_predict(tmp_path):
    cfg = config("mlip", n=8, epochs=1, Scheduler={"type": "CosineAnnealingLR"})
    cfg["Verbosity"]["level"] = 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "run"
    train = _run(
        "import sys; from hydragnn.train.cli import train_main; sys.exit(train_main())",
        str(path),
        "--run-dir",
        str(run_dir),
    )
    assert train.returncode == 0, train.stderr[-3000:]
    for name in (
        "model.hydra",
        "config.json",
        "metrics.json",
        "checkpoint.pt",
        "test_set.pkl",
        "train.log",
        "parity_energy.png",
        "parity_atomic_energy.png",
        "parity_forces.png",
    ):
        assert (run_dir / name).exists(), name
    assert any((run_dir / "tensorboard").iterdir())
    assert "best epoch" in train.stdout and "eV/Å" in train.stdout
    assert train.stdout.count("threads: ") == 1 and " intra-op (" in train.stdout  # the threading notice
    for fact in ("best epoch", "test loss", "  forces "):  # each fact printed once
        assert train.stdout.count(fact) == 1, (fact, train.stdout)
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    shown = train.stdout.splitlines()[:-1]  # the last line, "run folder: ...", comes after the run
    assert shown and all(line in log for line in shown)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["NeuralNetwork"]["Training"]["Scheduler"] == {
        "type": "CosineAnnealingLR",
        "T_max": 1,
        "eta_min": 0.0,
        "warmup_steps": 0,
    }
    predict = _run(
        "import sys; from hydragnn.train.cli import predict_main; sys.exit(predict_main())",
        str(run_dir / "model.hydra"),
        str(run_dir / "test_set.pkl"),
        "--json",
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    result = json.loads(predict.stdout.strip().splitlines()[-1])
    assert math.isclose(result["loss"], metrics["test"]["loss"], rel_tol=1e-5)
    for head, r in metrics["test"]["mae"].items():
        assert math.isclose(result["mae"][head]["mae"], r["mae"], rel_tol=1e-5), head


def test_invalid_config_is_a_clean_error(tmp_path):
    cfg = config()
    cfg["NeuralNetwork"]["Training"]["Optimizer"]["lr"] = 0.1
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = _run("import sys; from hydragnn.train.cli import train_main; sys.exit(train_main())", str(path))
    assert out.returncode == 2
    assert "NeuralNetwork.Training.Optimizer.lr: unknown key" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_data_file_is_reported_before_torch_loads(tmp_path):
    cfg = config()
    cfg["Dataset"] = {"name": "mine", "train_file": "train.xyz", "test_file": "test.xyz"}
    (tmp_path / "test.xyz").write_text("")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code = (
        "import sys; from hydragnn.train.cli import train_main; rc = train_main(); "
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded'); sys.exit(rc)"
    )
    out = _run(code, str(path))
    assert out.returncode == 2 and "torch not loaded" in out.stdout
    assert f"no such file: Dataset.train_file: {tmp_path / 'train.xyz'}" in out.stderr
    assert "test_file" not in out.stderr and "Traceback" not in out.stderr


def test_train_under_torchrun_ddp(tmp_path):
    """The CLI pipeline itself on 2 processes (gloo): the strategy is a config choice, not code."""
    import os

    import torch

    from hydragnn.models import load_artifact

    cfg = config("mlip", n=16, epochs=1, Parallelism={"strategy": "ddp"}, max_time_s=600)
    cfg["Verbosity"]["level"] = 2  # with a budget the ranks time steps and agree on the committee size
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "hydragnn.train.cli",
        str(path),
        "--run-dir",
        str(run_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env)
    # a rank may abort in C++ after finishing (FACTS: "terminate called without an active exception")
    late_abort = "terminate called without an active exception" in proc.stderr
    assert proc.returncode == 0 or late_abort, proc.stderr[-3000:]
    assert "Grad strides do not match bucket view strides" not in proc.stderr  # DDP's layout warning
    assert "per rank" in proc.stdout and "best epoch" in proc.stdout, proc.stdout[-2000:]
    assert proc.stdout.count("run folder:") == 1  # only rank 0 reports
    assert proc.stdout.count("committee auto: 1 member: a training step takes") == 1  # 1 epoch: too few to share
    assert (run_dir / "train.log").read_text(encoding="utf-8").count("best epoch") == 1  # and logs
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["NeuralNetwork"]["Training"]["Parallelism"]["strategy"] == "ddp"
    model = load_artifact(run_dir / "model.hydra")  # a plain single-process model
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert all(math.isfinite(r["mae"]) for r in metrics["test"]["mae"].values())
    # test errors cover the whole test split (4 of 16 structures), gathered from both ranks
    assert metrics["test"]["mae"]["energy"]["count"] == 4
    assert metrics["test"]["mae"]["forces"]["count"] == 4 * 32
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_predict_json_is_valid_json_when_errors_are_nan(monkeypatch, capsys, tmp_path):
    """A diverged model's NaN errors are printed as null: strict JSON parsers accept the output."""
    import json as json_module

    import hydragnn.train.predict as predict_module
    from hydragnn.train.cli import predict_main

    result = {"loss": float("nan"), "mae": {"energy": {"mae": float("nan"), "rmse": float("inf"), "unit": "eV/atom"}}}
    monkeypatch.setattr(predict_module, "predict", lambda *a, **k: (result, {}, {}))
    assert predict_main([str(tmp_path / "m.hydra"), str(tmp_path / "d.xyz"), "--json"]) == 0
    text = capsys.readouterr().out.strip()
    assert "NaN" not in text and "Infinity" not in text
    parsed = json_module.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert parsed["loss"] is None and parsed["mae"]["energy"] == {"mae": None, "rmse": None, "unit": "eV/atom"}


def test_predict_prints_errors_in_physical_units_not_the_loss(monkeypatch, capsys, tmp_path):
    """The human output is the MAE / RMSE table with units; the unitless training objective stays in --json."""
    import hydragnn.train.predict as predict_module
    from hydragnn.train.cli import predict_main

    result = {
        "loss": 0.123,
        "mae": {
            "energy": {"mae": 0.0041, "rmse": 0.0055, "unit": "eV/atom"},
            "forces": {"mae": 0.045, "rmse": 0.06, "unit": "eV/Å"},
        },
    }
    monkeypatch.setattr(predict_module, "predict", lambda *a, **k: (result, {}, {}))
    assert predict_main([str(tmp_path / "m.hydra"), str(tmp_path / "d.xyz")]) == 0
    text = capsys.readouterr().out
    assert "loss" not in text and "0.123" not in text
    assert "eV/atom" in text and "eV/Å" in text and "0.0041" in text and "0.045" in text
