"""A committee exported with ``uncertainty``: the TorchScript file and the metatomic file give the
members' spread as the calculator serves it, the LAMMPS driver of an exported file applies a limit
to it, and a model without a committee is refused before anything is written."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from hydragnn.infer import ExtrapolationError, HydraCalculator, InferenceError, UncertaintyLimit
from hydragnn.infer.export import ExportedModel, ExportError, describe, export_model
from hydragnn.infer.export.cli import main as export_cli
from hydragnn.infer.lammps_potentials import ExportedPotential
from hydragnn.models import save_artifact
from hydragnn.models.testing import build


@pytest.fixture(scope="module")
def committee():
    return build("SchNet", seed=0, committee=3, precision="fp64")


@pytest.fixture(scope="module")
def exported(committee, tmp_path_factory):
    """The committee's artifact exported by the CLI with --uncertainty (TorchScript)."""
    folder = tmp_path_factory.mktemp("export")
    artifact = save_artifact(committee, folder / "committee.hydra", species=[29, 79])
    assert export_cli([str(artifact), str(folder / "committee.pt"), "--uncertainty"]) == 0
    return folder / "committee.pt"


def _served(committee, atoms):
    calc = HydraCalculator(committee, uncertainty=True)
    out = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, pbc=atoms.pbc, forces=True, stress=True)
    committee.with_spread = False  # the calculator set it on the shared fixture
    return out


def test_the_file_gives_the_calculators_uncertainty_on_a_cell_it_was_not_traced_on(committee, exported, cuau_atoms):
    outputs = describe(exported)["outputs"]
    assert outputs["energy_uncertainty"] == "structure" and outputs["forces_uncertainty"] == "atom"
    atoms = cuau_atoms[2]
    got = ExportedModel(exported)(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    want = _served(committee, atoms)
    torch.testing.assert_close(got["energy"], want["energy"][0])
    torch.testing.assert_close(got["forces"], want["forces"])
    torch.testing.assert_close(got["stress"], want["stress"][0])
    torch.testing.assert_close(got["energy_uncertainty"], want["energy_uncertainty"][0])
    torch.testing.assert_close(got["forces_uncertainty"], want["forces_uncertainty"])
    assert got["forces_uncertainty"].shape == (len(atoms),) and bool((got["forces_uncertainty"] > 0).all())
    if "atomic_energy_uncertainty" in want:
        torch.testing.assert_close(got["atomic_energy_uncertainty"], want["atomic_energy_uncertainty"])


def test_the_lammps_driver_of_the_file_stops_or_flags(exported, cuau_atoms, tmp_path):
    atoms = cuau_atoms[0]
    args = (atoms.positions, atoms.numbers, atoms.cell.array, np.asarray(atoms.pbc))
    potential = ExportedPotential(exported, uncertainty_limit=UncertaintyLimit(1e-9, "flag"))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        potential(*args)
    assert potential.uncertainty_limit is not None and len(potential.uncertainty_limit.flagged) == 1
    stopping = ExportedPotential(exported, uncertainty_limit=1e-9)
    with pytest.raises(ExtrapolationError, match="ExportedPotential, call 1: the committee's force uncertainty"):
        stopping(*args)
    plain = export_model(build("SchNet", seed=0, precision="fp64"), tmp_path / "plain.pt")
    with pytest.raises(InferenceError, match="gives no forces_uncertainty; export a committee"):
        ExportedPotential(plain.path, uncertainty_limit=0.1)


def test_a_single_model_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ExportError, match=r"uncertainty needs a committee \(Architecture.committee >= 2\)"):
        export_model(build("SchNet", seed=0, precision="fp64"), tmp_path / "single.pt", uncertainty=True)
    assert list(tmp_path.iterdir()) == []


def test_metatomic_serves_energy_uncertainty_to_its_ase_calculator(committee, cuau_atoms, tmp_path):
    pytest.importorskip("metatomic_ase")
    from hydragnn.infer.export.pyg_patch import pyg_index_select_restored

    report = export_model(committee, tmp_path / "committee_mta.pt", format="metatomic", uncertainty=True)
    atoms = cuau_atoms[1].copy()
    want = _served(committee, atoms)
    per_atom = "atomic_energy_uncertainty" in want
    assert ("atomic_energy_uncertainty" if per_atom else "energy_uncertainty") in report.errors
    with pyg_index_select_restored():
        from metatomic_ase import MetatomicCalculator

        # the calculator's warning is per atom: only a per-atom uncertainty is compared
        threshold = 1e-12 if per_atom else None
        atoms.calc = MetatomicCalculator(str(report.path), uncertainty_threshold=threshold)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            energy = atoms.get_potential_energy()
    np.testing.assert_allclose(energy, float(want["energy"][0]), rtol=1e-9)
    if per_atom:
        assert any("atomic energy uncertainties are larger than the threshold" in str(w.message) for w in caught)
