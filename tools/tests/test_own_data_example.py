"""examples/own_data end to end, as a user runs it: write the extxyz files, train with the
example's config through the ``hydragnn-train`` command, predict on the test file, serve with ASE.

The only change to the example is a shorter run (one epoch, a narrower model) in a copy of its
config beside the files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_data"
TIMEOUT_S = 600


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def test_own_data_example(tmp_path):
    _run(str(EXAMPLE / "make_data.py"), "--out", str(tmp_path), cwd=tmp_path)
    assert {p.name for p in tmp_path.glob("*.xyz")} == {"train.xyz", "valid.xyz", "test.xyz"}
    config = json.loads((EXAMPLE / "train.json").read_text())
    config["NeuralNetwork"]["Architecture"]["hidden_dim"] = 16
    config["NeuralNetwork"]["Training"]["num_epoch"] = 1
    (tmp_path / "train.json").write_text(json.dumps(config))
    train = _run("-m", "hydragnn.train.cli", "train.json", "--run-dir", "run", cwd=tmp_path)
    assert "reference energies (isolated_atoms" in train.stdout and "eV/atom" in train.stdout
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["test"]["mae"]) == {"energy", "forces", "stress"}
    code = "import sys; from hydragnn.train.cli import predict_main; sys.exit(predict_main())"
    predicted = _run("-c", code, "run/model.hydra", "test.xyz", "--json", cwd=tmp_path)
    result = json.loads(predicted.stdout.strip().splitlines()[-1])
    assert abs(result["mae"]["forces"]["mae"] - metrics["test"]["mae"]["forces"]["mae"]) < 1e-5
    served = _run(str(EXAMPLE / "serve.py"), "run/model.hydra", "--steps", "5", cwd=tmp_path)
    assert "108-atom Cu-Au cell" in served.stdout and "NVE, 1 fs, 5 steps" in served.stdout
    shutil.rmtree(tmp_path / ".hydragnn_cache")


def _molecule_frames(seed: int, count: int) -> list:
    """``count`` rattled copies of small H/C/N/O molecules labelled by ASE's EMT (which has H, C,
    N and O parameters), under the example's ``REF_*`` keys."""
    import numpy as np
    from ase.build import molecule
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    names = ["CH4", "NH3", "H2O", "CH3OH", "HCN", "CH3CN"]
    frames = []
    for k in range(count):
        atoms = molecule(names[k % len(names)])
        atoms.positions += rng.normal(0.0, 0.05, atoms.positions.shape)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = float(atoms.get_potential_energy())
        atoms.arrays["REF_forces"] = atoms.get_forces().copy()
        atoms.calc = None
        frames.append(atoms)
    return frames


def test_molecules_recipe_trains_and_predicts(tmp_path):
    """examples/own_data/molecules_mace.json (the MACE recipe for molecules, a committee of two)
    on molecules of H, C, N and O: trains through ``hydragnn-train`` for two epochs, the second at
    the recipe's second-stage weights; the model it writes predicts the test file and keeps the
    recipe's 16-wide energy readout."""
    import ase.io

    for name, seed, count in (("train", 0, 24), ("valid", 1, 6), ("test", 2, 6)):
        ase.io.write(tmp_path / f"{name}.xyz", _molecule_frames(seed, count), format="extxyz")
    config = json.loads((EXAMPLE / "molecules_mace.json").read_text())
    config["NeuralNetwork"]["Architecture"]["hidden_dim"] = 8
    config["NeuralNetwork"]["Training"].update({"num_epoch": 2, "max_time_s": None})
    config["NeuralNetwork"]["Training"]["SecondStage"]["start"] = 0.5
    (tmp_path / "train.json").write_text(json.dumps(config))
    train = _run("-m", "hydragnn.train.cli", "train.json", "--run-dir", "run", cwd=tmp_path)
    assert "second stage from epoch 1" in train.stdout and "energy 10 -> 1000" in train.stdout
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["test"]["mae"]) == {"energy", "forces"}
    code = "import sys; from hydragnn.train.cli import predict_main; sys.exit(predict_main())"
    predicted = _run("-c", code, "run/model.hydra", "test.xyz", "--json", cwd=tmp_path)
    result = json.loads(predicted.stdout.strip().splitlines()[-1])
    assert abs(result["mae"]["forces"]["mae"] - metrics["test"]["mae"]["forces"]["mae"]) < 1e-5
    from torch import nn

    from hydragnn.models.artifact import load_artifact

    committee = load_artifact(tmp_path / "run" / "model.hydra")
    for member in committee.members:  # the recipe's per-atom energy readout: one hidden layer of 16
        linear = [m for m in member.energy_head.atom.net if isinstance(m, nn.Linear)]
        widths = [(m.in_features, m.out_features) for m in linear]
        assert widths == [(8, 16), (16, 1)]
    shutil.rmtree(tmp_path / ".hydragnn_cache", ignore_errors=True)
