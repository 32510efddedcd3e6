"""tools/bench/uncertainty_calibration.py: Spearman's rank correlation and a committee's report on labelled splits."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "uncertainty_calibration", ROOT / "tools" / "bench" / "uncertainty_calibration.py"
)
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


def test_spearman_ranks_with_ties():
    a = np.array([1.0, 2.0, 3.0, 4.0])
    assert calibration.spearman(a, a**3) == pytest.approx(1.0)
    assert calibration.spearman(a, -a) == pytest.approx(-1.0)
    # ties share their mean rank: [1, 1, 2] has ranks [0.5, 0.5, 2]
    np.testing.assert_allclose(calibration._ranks(np.array([1.0, 1.0, 2.0])), [0.5, 0.5, 2.0])
    assert calibration.spearman(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)


def test_a_committee_is_scored_per_split(tmp_path):
    import ase.io

    from hydragnn.data.emt import generate_cuau_atoms
    from hydragnn.infer import HydraCalculator
    from hydragnn.models import save_artifact
    from hydragnn.models.testing import build

    committee = build("SchNet", seed=0, committee=2, precision="fp64")
    model = save_artifact(committee, tmp_path / "c.hydra", species=[29, 79])
    calc = HydraCalculator(model)
    for name, seed in (("seen", 1), ("unseen", 2)):
        frames = generate_cuau_atoms(3, seed=seed)
        for atoms in frames:
            out = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True)
            atoms.info["REF_energy"] = float(out["energy"][0]) + 0.01 * len(atoms)  # 10 meV/atom off
            atoms.arrays["REF_forces"] = out["forces"].numpy()
        ase.io.write(tmp_path / f"{name}.xyz", frames, format="extxyz")
    report = calibration.score(str(model), [tmp_path / "seen.xyz", tmp_path / "unseen.xyz"])
    assert sorted(report["splits"]) == ["seen", "unseen"]
    for split in report["splits"].values():
        assert split["structures"] == 3
        assert split["energy_error_meV_per_atom"] == pytest.approx(10.0)
        assert split["force_mae_meV_per_A"] == pytest.approx(0.0, abs=1e-3)  # extxyz keeps ~8 digits
        assert split["max_force_uncertainty"] > 0
    assert all(-1.0 <= rho <= 1.0 for rho in report["spearman"].values())
