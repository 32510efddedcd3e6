"""Process-wide defaults (hydragnn.models.execution.process) come only from explicit calls: importing any
layer changes nothing; the command lines set OpenMP's passive wait policy before torch loads."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "data_threads_tests", ROOT / "packages/hydra-models/tests/test_execution_process.py"
)
data_threads_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_threads_tests)

LAYERS = ("hydragnn.data", "hydragnn.models", "hydragnn.train", "hydragnn.infer")
CLIS = ("hydragnn.train.cli", "hydragnn.infer.evaluate_cli", "hydragnn.infer.export.cli")
ENTRY_POINTS = (
    "hydragnn.train.cli:train_main",
    "hydragnn.train.cli:predict_main",
    "hydragnn.infer.evaluate_cli:main",
    "hydragnn.infer.export.cli:main",
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_importing_every_layer_and_command_line_module_changes_nothing_process_wide():
    """OMP_WAIT_POLICY unset stays unset, no variable changes, glibc's mmap threshold is untouched."""
    got = data_threads_tests.import_only(*LAYERS, *CLIS)
    assert got == {"changed": {}, "mapped": True, "torch": False}


_ENTRY = """
import json, os, sys
module, function = sys.argv[1].split(":")
main = getattr(__import__(module, fromlist=[function]), function)
try:
    main(sys.argv[2:] or ["--version"])
except SystemExit:
    pass
print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY"), "torch": "torch" in sys.modules}))
"""


def _entry(target: str, *args: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    run = subprocess.run([sys.executable, "-c", _ENTRY, target, *args], env={**environ, **env}, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _config(folder: pathlib.Path, **training: object) -> str:
    """A valid config whose data file is missing: ``hydragnn-train`` refuses it before torch loads."""
    config = {
        "Dataset": {"name": "probe", "train_file": "missing.xyz", "energy_key": "energy"},
        "NeuralNetwork": {
            "Architecture": {"mpnn_type": "SchNet", "radius": 4.0, "enable_interatomic_potential": True},
            "Training": {"num_epoch": 1, **training},
        },
    }
    path = folder / f"config{len(training)}.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("target", ENTRY_POINTS)
def test_each_command_line_waits_passively_unless_the_user_chose(target, tmp_path):
    """Every console script (and ``torchrun -m hydragnn.train.cli``, which runs ``train_main``)
    sets ``OMP_WAIT_POLICY=PASSIVE`` before anything loads torch under the default profile, and
    keeps the user's policy; ``hydragnn-train`` does as its config's ``Training.execution`` says
    (the ``"reference"`` profile leaves the process alone)."""
    args = (_config(tmp_path),) if target.endswith("train_main") else ()
    assert _entry(target, *args) == {"policy": "PASSIVE", "torch": False}
    assert _entry(target, *args, OMP_WAIT_POLICY="ACTIVE")["policy"] == "ACTIVE"
    if args:
        assert _entry(target, _config(tmp_path, execution="reference")) == {"policy": None, "torch": False}


def test_every_console_script_is_an_entry_point_tested_here():
    scripts: dict[str, str] = {}
    for dist in ("hydra-train", "hydra-infer"):
        text = (ROOT / "packages" / dist / "pyproject.toml").read_text()
        block = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
        scripts |= dict(line.replace('"', "").split(" = ") for line in block.strip().splitlines())
    assert sorted(scripts.values()) == sorted(ENTRY_POINTS)
