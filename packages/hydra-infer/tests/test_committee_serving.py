"""A committee (``Architecture.committee``) is served like one model: every calculator mode and
the exported file give the mean of its members, which are served alone for the reference."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from infer_helpers import cluster, tiny_model

from hydragnn.infer import HydraASECalculator, HydraCalculator
from hydragnn.infer.export import ExportedModel, export_model
from hydragnn.models import Committee, load_artifact, save_artifact


@pytest.fixture(scope="module")
def committee():
    model = tiny_model(seed=3, committee=3)
    assert isinstance(model, Committee)
    return model


def _members_mean(model, pos, numbers, **kwargs):
    outs = [HydraCalculator(copy.deepcopy(m))(pos, numbers, **kwargs) for m in model.members]
    return {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}


def test_calculator_serves_the_members_mean(committee):
    pos, numbers = cluster(12, seed=1)
    got = HydraCalculator(committee)(pos, numbers, forces=True)
    want = _members_mean(committee, pos, numbers, forces=True)
    assert {"energy", "forces"} <= set(got)
    for key in ("energy", "forces"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-10, atol=1e-12)


def test_periodic_stress_and_replay_engine(committee, cuau_atoms, graph_calc):
    """A periodic cell with stress, eager and on the CUDA-graph engine (CPU replay backend)."""
    atoms = cuau_atoms[0]
    kwargs = dict(cell=atoms.cell.array, pbc=atoms.pbc, forces=True, stress=True)
    want = _members_mean(committee, atoms.positions, atoms.numbers, **kwargs)
    for calc in (HydraCalculator(committee), graph_calc(committee)):
        got = calc(atoms.positions, atoms.numbers, **kwargs)
        for key in ("energy", "forces", "stress"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-10)


def test_artifact_in_ase(committee, cuau_atoms, tmp_path):
    path = save_artifact(committee, tmp_path / "committee.hydra", species=[29, 79])
    assert isinstance(load_artifact(path), Committee)
    atoms = cuau_atoms[1].copy()
    atoms.calc = HydraASECalculator(str(path))
    want = _members_mean(committee, atoms.positions, atoms.numbers, cell=atoms.cell.array, pbc=atoms.pbc, forces=True)
    np.testing.assert_allclose(atoms.get_forces(), want["forces"].numpy(), rtol=1e-9, atol=1e-10)


def test_torchscript_export(committee, cuau_atoms, tmp_path):
    """The exported file is the committee (its own check against the calculator passed) and
    equals the members' mean on a cell it was not traced on."""
    report = export_model(committee, tmp_path / "committee.pt")
    assert max(report.errors.values()) <= report.tolerance
    atoms = cuau_atoms[2]
    out = ExportedModel(tmp_path / "committee.pt")(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    want = _members_mean(committee, atoms.positions, atoms.numbers, cell=atoms.cell.array, pbc=atoms.pbc, forces=True)
    np.testing.assert_allclose(out["forces"].numpy(), want["forces"].numpy(), rtol=1e-9, atol=1e-10)


def test_replay_checks_every_member(committee):
    """A member whose encoder cannot be captured keeps the whole committee off CUDA-graph replay."""
    from hydragnn.infer.modes import graph_model_problem

    assert graph_model_problem(committee) is None
    model = copy.deepcopy(committee)
    model.members[2].encoder.capture_safe = False
    assert "SchNet's forward is not capture-safe" in graph_model_problem(model)
