"""examples/conditioning_charge_spin.py end to end, shortened (40 clusters, 2 epochs): it imported a
name that had moved (``prepare_samples``) and nothing ran it. A short run does not learn the
charging energy; what is checked is that the example runs and writes its summary of finite errors
and the charge response of one test cluster, whose reference is symmetric in the charge."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conditioning_charge_spin.py"


def test_conditioning_example_runs_short(tmp_path):
    args = [sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--structures", "40", "--epochs", "2"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["structures"] == 40
    for head in ("energy", "forces"):
        assert math.isfinite(summary["test_mae"][head]["mae"]) and summary["test_mae"][head]["count"] > 0
    response = {row["Q"]: row for row in summary["charge_response"]}
    assert set(response) == {-2, -1, 0, 1, 2}
    assert response[0]["reference_eV"] == 0.0 and response[0]["model_eV"] == 0.0
    assert math.isclose(response[-2]["reference_eV"], response[2]["reference_eV"], rel_tol=1e-9)
    assert all(math.isfinite(row["model_eV"]) for row in response.values())
