"""The whole run config validates before torch is imported: ``load_config`` and the CLI's config errors.

Subprocesses, so that ``sys.modules`` shows what parsing itself loads.
"""

from __future__ import annotations

import json
import subprocess
import sys

from train_helpers import config

HEAVY = ("torch", "torch_geometric", "e3nn")
TIMEOUT_S = 120

LOAD = """
import json, sys
from hydragnn.train.config import load_config
from hydragnn.train.errors import ConfigError
try:
    cfg = load_config(sys.argv[1])
    out = {"ok": [cfg.model_config.mpnn_type, cfg.model_config.encoder.num_gaussians, cfg.training.num_epoch]}
except ConfigError as exc:
    out = {"error": str(exc)}
out["heavy"] = [m for m in sys.argv[2:] if m in sys.modules]
print(json.dumps(out))
"""


def _mlip_config() -> dict:
    cfg = config("mlip", Batching={"mode": "node_budget", "max_nodes": 64})
    cfg["NeuralNetwork"]["Architecture"].update(num_filters=16, num_gaussians=12, activation="tanh")
    return cfg


def _load(tmp_path, cfg: dict) -> dict:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(path), *HEAVY], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_full_mlip_config_loads_without_torch(tmp_path):
    out = _load(tmp_path, _mlip_config())
    assert out == {"ok": ["SchNet", 12, 2], "heavy": []}


def test_an_encoder_key_typo_is_reported_without_torch(tmp_path):
    cfg = _mlip_config()
    arch = cfg["NeuralNetwork"]["Architecture"]
    arch["num_gausians"] = arch.pop("num_gaussians")
    out = _load(tmp_path, cfg)
    assert out["heavy"] == []
    assert out["error"].startswith(
        "NeuralNetwork.Architecture.num_gausians: unknown key (did you mean 'num_gaussians'?)"
    )


def test_a_training_key_typo_is_reported_without_torch(tmp_path):
    cfg = _mlip_config()
    training = cfg["NeuralNetwork"]["Training"]
    training["num_epochs"] = training.pop("num_epoch")
    out = _load(tmp_path, cfg)
    assert out["heavy"] == []
    assert out["error"].startswith("NeuralNetwork.Training.num_epochs: unknown key (did you mean 'num_epoch'?)")


def test_cli_reports_a_config_error_before_importing_torch(tmp_path):
    cfg = _mlip_config()
    training = cfg["NeuralNetwork"]["Training"]
    training["num_epochs"] = training.pop("num_epoch")
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hydragnn.train.cli", str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "hydragnn-train: error: NeuralNetwork.Training.num_epochs: unknown key (did you mean 'num_epoch'?)"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    # -X importtime writes "import time: self | cumulative | module" for every module imported
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "hydragnn.train.config" in imported  # the check sees the imports
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert not (tmp_path / "runs").exists()
