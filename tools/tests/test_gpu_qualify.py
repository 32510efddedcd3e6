"""tools/gpu/qualify.sh: its CPU dry run (every section through the replay backend) passes and
ends in the JSON report the GPU run writes; without a GPU and without --dry-run it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_passes_every_section(tmp_path):
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu" / "qualify.sh"), "--dry-run", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    sections = report["sections"]
    assert set(sections) == {"environment", "gpu_tests", "lifecycle", "parity", "benchmark"}
    assert all(s["status"] == "pass" for s in sections.values()), {k: s["status"] for k, s in sections.items()}
    assert all(sections["lifecycle"]["checks"].values())
    engines = {row["engine"] for row in sections["parity"]["rows"]}
    assert engines == {"dense", "sparse", "periodic"} and all(row["replayed"] for row in sections["parity"]["rows"])
    modes = {row["mode"] for row in sections["benchmark"]["report"]["steady"]}
    assert modes == {"regular", "graph"}
    peak = sections["benchmark"]["report"]["peak"]  # on CPU: the fraction of peak and where the time goes
    assert peak and all(row["fraction_of_peak"] > 0 for row in peak)
    for row in peak:
        shares = row["time_shares"]
        assert shares["matrix products"] > 0 and shares["element-wise / reductions"] > 0, shares
        assert min(shares.values()) >= 0 and sum(shares.values()) >= 1 - 1e-9, shares
    assert sections["gpu_tests"]["tests"] >= 5


def test_refuses_a_real_run_without_a_gpu():
    if torch.cuda.is_available():  # pragma: no cover - on a GPU machine the real run is the point
        return
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu" / "qualify.py"), "--sections", "environment"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "run with --dry-run" in proc.stdout


def test_accepting_an_older_runtime_lowers_the_floor_and_is_recorded(tmp_path, monkeypatch):
    """``--accept torch=2.11`` (an image that cannot be upgraded): the engine's floor is lowered in
    this process and the report says so; names outside the engine's floors are refused."""
    import pytest

    monkeypatch.syspath_prepend(str(ROOT / "tools" / "gpu"))
    import _floor_override

    from hydragnn.infer import modes

    assert _floor_override.parse("torch=2.11, warp-lang=1.18") == {"torch": (2, 11), "warp-lang": (1, 18)}
    with pytest.raises(ValueError, match="DIST=VERSION"):
        _floor_override.parse("torch")
    with pytest.raises(ValueError, match="the engine's floors"):
        _floor_override.apply({"numpy": (1, 0)})
    monkeypatch.setattr(modes, "MIN_VERSIONS", dict(modes.MIN_VERSIONS))
    assert modes.MIN_VERSIONS["torch"] > (2, 11)
    _floor_override.apply(_floor_override.parse("torch=2.11"))
    assert modes.MIN_VERSIONS["torch"] == (2, 11)
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu" / "qualify.py"), "--dry-run", "--sections", "environment",
         "--accept", "torch=2.11", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text())["accepted_below_validated"] == {"torch": "2.11"}


def test_device_wheel_scripts_parse():
    for name in ("prepare_device_wheels.sh", "install_device_wheels.sh"):
        proc = subprocess.run(["bash", "-n", str(ROOT / "tools" / "gpu" / name)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
