"""The data layer's read-only diagnosis of OpenMP busy waiting (it tunes nothing: that is the execution layer's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hydragnn.data.threads import spinning_threads


def test_spinning_threads_are_those_nobody_chose():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert spinning_threads({}) == 2
        assert spinning_threads({"OMP_WAIT_POLICY": "ACTIVE"}) == 0  # chosen, even if it spins
        assert spinning_threads({"OMP_NUM_THREADS": "2"}) == 0
        torch.set_num_threads(1)
        assert spinning_threads({}) == 0  # one thread waits for nobody
    finally:
        torch.set_num_threads(before)


CONVERT_SCRIPT = """
import sys, warnings
import torch
torch.set_num_threads(2)
from hydragnn.data import AseSource, convert_source
from hydragnn.data.emt import generate_alloy_atoms, write_extxyz
write_extxyz(sys.argv[1] + "/cells.xyz", generate_alloy_atoms(("Ni", "Al"), 6, 4, seed=0))
source = AseSource(sys.argv[1] + "/cells.xyz", energy_key="REF_energy", forces_key="REF_forces")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for cache in ("a", "b"):  # two conversions, one process: told once
        convert_source(source, cutoff=4.0, cache_dir=sys.argv[1] + "/" + cache)
print("spinning warnings:", sum("threads spin" in str(w.message) for w in caught))
"""


@pytest.mark.parametrize(("chosen", "expected"), [({}, 1), ({"OMP_WAIT_POLICY": "PASSIVE"}, 0)])
def test_a_conversion_from_a_script_says_once_when_threads_spin(tmp_path, chosen, expected):
    """A script that loaded torch first converts a file: OpenMP spins on two threads nobody chose
    (1.6x slower with a busy core at 32-atom cells), so the conversion says so once, naming the fix;
    with a wait policy in the environment it says nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    out = subprocess.run(
        [sys.executable, "-c", CONVERT_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**env, **chosen},
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"spinning warnings: {expected}" in out.stdout, out.stdout + out.stderr[-2000:]
