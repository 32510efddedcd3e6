"""``hydragnn-train`` and ``hydragnn-predict`` end to end, in subprocesses (with timeouts)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

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
        "parity_energy.png",
        "parity_atomic_energy.png",
        "parity_forces.png",
    ):
        assert (run_dir / name).exists(), name
    assert any((run_dir / "tensorboard").iterdir())
    assert "best epoch" in train.stdout and "eV/Å" in train.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["NeuralNetwork"]["Training"]["Scheduler"] == {"type": "CosineAnnealingLR", "T_max": 1, "eta_min": 0.0}
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
