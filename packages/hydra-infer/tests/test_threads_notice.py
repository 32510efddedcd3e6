"""A script of one's own: the first calculator says once when OpenMP spins on threads nobody chose."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import warnings
import torch
torch.set_num_threads(2)
from infer_helpers import tiny_model
from hydragnn.infer import HydraCalculator
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    HydraCalculator(tiny_model())
    HydraCalculator(tiny_model())
print("spinning warnings:", sum("threads spin" in str(w.message) for w in caught))
"""


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.update(env_extra, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + env.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_spinning_openmp_is_named_once_with_the_fix():
    assert "spinning warnings: 1" in _run({})


def test_no_warning_when_the_user_chose():
    assert "spinning warnings: 0" in _run({"OMP_WAIT_POLICY": "PASSIVE"})
    assert "spinning warnings: 0" in _run({"OMP_NUM_THREADS": "2"})
