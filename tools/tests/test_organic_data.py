"""tools/bench/_organic_data.py: GFN2-xTB MD data of the organic benchmark (quick mode, seconds)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("tblite")
ase_io = pytest.importorskip("ase.io")

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("organic_data", ROOT / "tools" / "bench" / "_organic_data.py")
organic_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(organic_data)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return organic_data.make_organic_data(
        tmp_path_factory.mktemp("organic") / "data", quick=True, seed=3, progress=False
    )


def _frames(path):
    return ase_io.read(str(path), index=":")


def _molecules(frames):
    return [a for a in frames if a.info.get("config_type") != "IsolatedAtom"]


def test_files_read_back_with_finite_labels(quick):
    manifest = quick["manifest"]
    assert not quick["cached"]
    assert set(quick["files"]) == set(organic_data.SPLITS)
    for split, path in quick["files"].items():
        frames = _frames(path)
        molecules = _molecules(frames)
        assert len(molecules) == manifest["splits"][split]["frames"] > 0
        for atoms in molecules:
            assert not atoms.pbc.any() and not atoms.cell.any()
            assert np.isfinite(atoms.info["REF_energy"])
            forces = atoms.arrays["REF_forces"]
            assert forces.shape == (len(atoms), 3) and np.isfinite(forces).all()
            assert atoms.info["molecule"] in manifest["splits"][split]["molecules"]
        temperatures = {a.info["temperature_K"] for a in molecules}
        assert temperatures == {manifest["splits"][split]["temperature_K"]}
    hot, cold = manifest["splits"]["test_hot"]["temperature_K"], manifest["splits"]["test"]["temperature_K"]
    assert hot > cold


def test_one_isolated_atom_per_element_in_train_only(quick):
    train = _frames(quick["files"]["train"])
    isolated = [a for a in train if a.info.get("config_type") == "IsolatedAtom"]
    symbols = [a.get_chemical_symbols()[0] for a in isolated]
    elements = {s for a in _molecules(train) for s in a.get_chemical_symbols()}
    elements |= {s for a in _frames(quick["files"]["test_unseen"]) for s in a.get_chemical_symbols()}
    assert sorted(symbols) == sorted(elements) and len(set(symbols)) == len(symbols)
    assert all(len(a) == 1 and np.isfinite(a.info["REF_energy"]) for a in isolated)
    for split in ("valid", "test", "test_hot", "test_unseen"):
        assert not any(a.info.get("config_type") == "IsolatedAtom" for a in _frames(quick["files"][split]))


def test_unseen_molecules_are_not_in_train(quick):
    formulas = {
        split: {a.get_chemical_formula() for a in _molecules(_frames(p))} for split, p in quick["files"].items()
    }
    assert formulas["test_unseen"] and not formulas["test_unseen"] & formulas["train"]
    for split in ("valid", "test", "test_hot"):
        assert formulas[split] == formulas["train"]
    # the full lists too, without running them
    train = {organic_data._formula(n) for n in organic_data.TRAIN_MOLECULES}
    unseen = {organic_data._formula(n) for n in organic_data.UNSEEN_MOLECULES}
    assert len(unseen) == len(organic_data.UNSEEN_MOLECULES) and not train & unseen


def test_the_wide_unseen_set_shares_no_formula_with_training_and_no_new_element():
    wide = organic_data.UNSEEN_SETS["wide"]
    assert len(set(wide)) == 15 and set(organic_data.UNSEEN_MOLECULES) < set(wide)
    assert organic_data._check_molecules(organic_data.TRAIN_MOLECULES, wide) == ["H", "C", "N", "O"]
    with pytest.raises(organic_data.OrganicDataError, match="unseen must be one of"):
        organic_data._settings(
            frames=1, valid_frames=1, test_frames=1, seed=0, quick=False, temperature_K=700.0,
            hot_temperature_K=1200.0, tblite_version="0.8.0", unseen="everything",
        )  # fmt: skip


def test_splits_are_disjoint_frames(quick):
    positions = {split: [a.positions.tobytes() for a in _molecules(_frames(p))] for split, p in quick["files"].items()}
    seen = set()
    for split in ("train", "valid", "test", "test_hot"):
        assert not seen & set(positions[split]), split
        seen |= set(positions[split])


def test_forces_are_minus_the_energy_gradient(quick):
    """Labels agree with a fresh tblite evaluation, and forces with a central finite difference."""
    TBLite, _ = organic_data._tblite()
    atoms = _molecules(_frames(quick["files"]["test_hot"]))[-1]
    ref_e, ref_f = atoms.info["REF_energy"], atoms.arrays["REF_forces"]
    scale = np.abs(ref_f).max()
    h = 1e-3  # Å
    with organic_data._one_openmp_thread():
        atoms.calc = organic_data._calculator(TBLite)
        assert atoms.get_potential_energy() == pytest.approx(ref_e, abs=1e-5)
        np.testing.assert_allclose(atoms.get_forces(), ref_f, atol=1e-4)
        for i, k in [(0, 0), (len(atoms) - 1, 2), (len(atoms) // 2, 1)]:
            energies = []
            for step in (h, -h):
                moved = atoms.copy()
                moved.positions[i, k] += step
                moved.calc = organic_data._calculator(TBLite)
                energies.append(moved.get_potential_energy())
            fd = -(energies[0] - energies[1]) / (2 * h)
            assert fd == pytest.approx(ref_f[i, k], abs=1e-3), (i, k)
    assert scale > 1e-2  # a frame with forces worth checking


def test_second_call_reuses_the_folder(quick):
    folder = quick["files"]["train"].parent
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = organic_data.make_organic_data(folder, quick=True, seed=3, progress=False)
    assert again["cached"] and again["manifest"] == quick["manifest"]
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    other = organic_data.make_organic_data(folder.parent / "other_seed", quick=True, seed=4, progress=False)
    assert not other["cached"]
    assert other["files"]["train"].read_bytes() != quick["files"]["train"].read_bytes()


def test_same_seed_gives_identical_files(quick, tmp_path):
    again = organic_data.make_organic_data(tmp_path / "again", quick=True, seed=3, progress=False)
    assert not again["cached"]
    for split, path in quick["files"].items():
        assert again["files"][split].read_bytes() == path.read_bytes(), split
    assert again["manifest"]["settings"] == quick["manifest"]["settings"]


def test_a_changed_file_is_regenerated(tmp_path):
    first = organic_data.make_organic_data(tmp_path, quick=True, frames=2, progress=False)
    good = first["files"]["valid"].read_bytes()
    first["files"]["valid"].write_text("damaged\n")
    second = organic_data.make_organic_data(tmp_path, quick=True, frames=2, progress=False)
    assert not second["cached"] and second["files"]["valid"].read_bytes() == good


def test_invalid_settings_and_missing_tblite(monkeypatch, tmp_path):
    with pytest.raises(organic_data.OrganicDataError, match="frames"):
        organic_data.make_organic_data(tmp_path, quick=True, frames=0, progress=False)
    monkeypatch.setitem(sys.modules, "tblite.ase", None)
    with pytest.raises(ImportError, match="pip install tblite"):
        organic_data.make_organic_data(tmp_path, quick=True, progress=False)
    assert organic_data.main(["--out", str(tmp_path), "--quick"]) == 2
