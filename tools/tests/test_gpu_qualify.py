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
