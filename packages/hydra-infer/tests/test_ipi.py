"""i-PI runs NVE with a HydraGNN potential: over ASE's socket client with HydraASECalculator, and
with an exported metatomic file through i-PI's own metatomic driver in a process where hydragnn
cannot be imported. Real i-PI (``ipi`` from PyPI), real sockets, a 32-atom Cu-Au cell."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk
from infer_helpers import tiny_model

from hydragnn.infer import HydraASECalculator, HydraCalculator
from hydragnn.infer.export import export_model
from hydragnn.models import save_artifact

STEPS = 40
BIN = Path(sys.executable).parent  # i-PI's scripts, installed with the test extra
INPUT = """<simulation verbosity="low" safe_stride="100000">
  <output prefix="sim">
    <properties stride="1" filename="out">[step, conserved{{electronvolt}}, potential{{electronvolt}}, temperature{{kelvin}}]</properties>
  </output>
  <total_steps>{steps}</total_steps>
  <prng><seed>31415</seed></prng>
  <ffsocket name="hydragnn" mode="unix" pbc="false">
    <address>{address}</address>
    <latency>1e-4</latency>
  </ffsocket>
  <system>
    <initialize nbeads="1">
      <file mode="ase">init.extxyz</file>
      <velocities mode="thermal" units="kelvin">300</velocities>
    </initialize>
    <forces><force forcefield="hydragnn"/></forces>
    <ensemble><temperature units="kelvin">300</temperature></ensemble>
    <motion mode="dynamics">
      <dynamics mode="nve"><timestep units="femtosecond">1.0</timestep></dynamics>
    </motion>
  </system>
</simulation>
"""


def cell():
    atoms = bulk("Cu", "fcc", a=3.62, cubic=True) * (2, 2, 2)
    atoms.numbers[::4] = 79
    atoms.rattle(0.05, seed=4)
    return atoms


def start_ipi(folder: Path) -> tuple[subprocess.Popen, str]:
    """i-PI serving NVE on a unique unix socket in ``folder``, once the socket exists."""
    address = f"hydragnn-{uuid.uuid4().hex[:10]}"
    cell().write(folder / "init.extxyz")
    (folder / "input.xml").write_text(INPUT.format(steps=STEPS, address=address))
    server = subprocess.Popen(
        [sys.executable, str(BIN / "i-pi"), "input.xml"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    socket = Path(f"/tmp/ipi_{address}")
    deadline = time.monotonic() + 60
    while not socket.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"i-PI did not open its socket: {server.communicate()[0][-2000:]}")
        time.sleep(0.1)
    return server, address


def finish(server: subprocess.Popen, folder: Path) -> np.ndarray:
    """Wait for i-PI; its properties ``[step, conserved, potential, temperature]`` per step."""
    try:
        output, _ = server.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
        pytest.fail("i-PI did not finish")
    assert server.returncode == 0, output[-2000:]
    return np.loadtxt(folder / "sim.out", ndmin=2)


def check_run(properties: np.ndarray, model) -> None:
    """Every step ran; the first potential is the calculator's energy; the conserved energy drifts little."""
    assert properties.shape[0] == STEPS + 1
    atoms = cell()
    energy = float(HydraCalculator(model)(atoms.positions, atoms.numbers, cell=atoms.cell.array)["energy"][0])
    assert properties[0, 2] == pytest.approx(energy, abs=1e-6)  # i-PI prints 6-7 significant digits
    assert properties[-1, 2] != pytest.approx(properties[0, 2], abs=1e-6)  # the atoms moved
    drift = np.abs(properties[:, 1] - properties[0, 1]).max()
    swing = np.ptp(properties[:, 2])
    assert drift < 1e-5 < 0.1 * swing, f"conserved energy drifted by {drift} eV (potential swing {swing} eV)"  # ~3e-8


def test_ipi_over_ase_socket_client(tmp_path):
    from ase.calculators.socketio import SocketClient

    model = tiny_model()
    server, address = start_ipi(tmp_path)
    atoms = cell()
    atoms.calc = HydraASECalculator(model)
    try:
        SocketClient(unixsocket=address).run(atoms)
    except BaseException:
        server.kill()
        raise
    check_run(finish(server, tmp_path), model)


def test_ipi_metatomic_driver_without_hydragnn(tmp_path):
    """``i-pi-py_driver -m metatomic`` on the exported file, hydragnn and PyG blocked in its process."""
    model = tiny_model()
    path = export_model(
        save_artifact(model, tmp_path / "m.hydra", species=[29, 79]), tmp_path / "m.pt", format="metatomic"
    ).path
    server, address = start_ipi(tmp_path)
    launcher = textwrap.dedent(
        f"""
        import runpy, sys
        for blocked in ("hydragnn", "torch_geometric"):
            sys.modules[blocked] = None
        sys.argv = ["i-pi-py_driver", "-u", "-a", {address!r}, "-m", "metatomic",
                    "-o", "template=init.extxyz,model={path}"]
        runpy.run_path({str(BIN / "i-pi-py_driver")!r}, run_name="__main__")
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.run(
        [sys.executable, "-c", launcher], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    properties = finish(server, tmp_path)
    assert "hydragnn" not in driver.stderr, driver.stderr[-2000:]  # no import of it was attempted
    check_run(properties, model)
