"""tools/bench/organic_fit.py's per-molecule breakdown and mlip_fit.py's evaluation behind it."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mlip_fit = _module("mlip_fit")


def _labelled(tmp_path, calc, groups: dict[str, tuple[int, float]]) -> pathlib.Path:
    """Frames labelled by ``calc``'s own prediction plus ``offset`` eV per atom, tagged ``molecule``."""
    import ase.io

    from hydragnn.data.emt import generate_cuau_atoms

    frames = []
    for k, (name, (count, offset)) in enumerate(groups.items()):
        for atoms in generate_cuau_atoms(count, seed=10 + k):
            out = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
            atoms.info["REF_energy"] = float(out["energy"][0]) - offset * len(atoms)
            atoms.arrays["REF_forces"] = out["forces"].numpy()
            atoms.info["molecule"] = name
            frames.append(atoms)
    path = tmp_path / "split.xyz"
    ase.io.write(path, frames, format="extxyz")
    return path


def test_evaluate_groups_errors_by_molecule_and_scores_each_member(tmp_path):
    from hydragnn.infer import HydraCalculator
    from hydragnn.models import save_artifact
    from hydragnn.models.testing import build

    committee = build("SchNet", seed=0, committee=2, precision="fp64")
    model = save_artifact(committee, tmp_path / "c.hydra", species=[29, 79])
    # the committee predicts 20 meV/atom above the labels of "a", 5 below those of "b"
    path = _labelled(tmp_path, HydraCalculator(model), {"a": (2, 0.020), "b": (3, -0.005)})
    scores = mlip_fit.evaluate(sys.executable, "hydra", model, path, 1, members=True)

    assert scores["structures"] == 5
    molecules = scores["per_molecule"]
    assert sorted(molecules) == ["a", "b"]
    assert molecules["a"]["e_bias"] == pytest.approx(20.0, abs=1e-3)
    assert molecules["b"]["e_bias"] == pytest.approx(-5.0, abs=1e-3)
    assert molecules["b"]["e_mae"] == pytest.approx(5.0, abs=1e-3)
    assert scores["e_mae"] == pytest.approx((2 * 20.0 + 3 * 5.0) / 5, abs=1e-3)
    assert scores["f_mae"] == pytest.approx(0.0, abs=1e-3)
    # the members are two different models, each with its own error (the labels are the mean's forces)
    assert len(scores["members"]) == 2
    assert scores["members"][0]["f_mae"] > 0 and scores["members"][0] != scores["members"][1]
    for value in scores["members_error_correlation"].values():
        assert -1.0 <= value <= 1.0


def test_evaluate_without_molecule_keys_has_no_breakdown(tmp_path):
    import ase.io

    from hydragnn.infer import HydraCalculator
    from hydragnn.models import save_artifact
    from hydragnn.models.testing import build

    model = save_artifact(build("SchNet", seed=0, precision="fp64"), tmp_path / "m.hydra", species=[29, 79])
    path = _labelled(tmp_path, HydraCalculator(model), {"x": (2, 0.0)})
    frames = ase.io.read(path, ":")
    for atoms in frames:
        del atoms.info["molecule"]
    ase.io.write(path, frames, format="extxyz")
    scores = mlip_fit.evaluate(sys.executable, "hydra", model, path, 1)
    assert scores["structures"] == 2 and scores["e_mae"] == pytest.approx(0.0, abs=1e-3)
    assert "per_molecule" not in scores and "members" not in scores


def test_breakdown_lists_the_worst_molecules_first_and_the_members():
    organic_fit = _module("organic_fit")
    report = {
        "baseline": {"test_unseen": 80.0},
        "HydraGNN": {
            "test_unseen": {
                "e_mae": 30.0,
                "f_mae": 150.0,
                "per_molecule": {
                    "CH3CN": {"e_bias": 10.0, "e_mae": 10.0, "f_mae": 120.0},
                    "H2CCO": {"e_bias": -50.0, "e_mae": 50.0, "f_mae": 180.0},
                },
                "members": [{"e_mae": 31.0, "f_mae": 160.0}, {"e_mae": 29.0, "f_mae": 165.0}],
                "members_error_correlation": {"energy": 0.93, "forces": 0.6},
            }
        },
        "MACE": {"test_unseen": {"per_molecule": {"H2CCO": {"e_bias": 80.0, "e_mae": 80.0, "f_mae": 200.0}}}},
    }
    lines = organic_fit.breakdown(report, "test_unseen")
    assert lines[1] == "| molecule | HydraGNN | MACE |"
    assert lines[3] == "| H2CCO | -50.0 / 50.0 / 180.0 | +80.0 / 80.0 / 200.0 |"
    assert lines[4] == "| CH3CN | +10.0 / 10.0 / 120.0 | - |"
    assert "members E / F 31.00 / 160.0, 29.00 / 165.0" in lines[5]
    assert "energy 0.93, forces 0.60" in lines[5]
    assert organic_fit.breakdown({"baseline": {}}, "test_unseen") == []
