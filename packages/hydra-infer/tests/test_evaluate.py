"""``hydragnn-evaluate`` / :func:`hydragnn.infer.evaluate.evaluate`: errors of a served model on
labelled structures, checked against errors computed here from the calculator's predictions."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import pytest
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.stress import full_3x3_to_voigt_6_stress
from infer_helpers import cluster, tiny_model

from hydragnn.data import SchemaError
from hydragnn.data.emt import generate_cuau_atoms, write_extxyz
from hydragnn.infer import HydraCalculator, InferenceError
from hydragnn.infer.evaluate import PREFIX, evaluate
from hydragnn.infer.evaluate_cli import main
from hydragnn.models import save_artifact
from hydragnn.models.metrics import format_errors

TIMEOUT_S = 240
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An artifact (fp64 SchNet MLIP: energy, atomic_energy, forces, stress) and 6 EMT Cu-Au cells
    as extxyz: labels in a SinglePointCalculator (``data.extxyz``) and in info / arrays under
    ``REF_`` (``ref.extxyz``)."""
    root = tmp_path_factory.mktemp("evaluate")
    structures = generate_cuau_atoms(6, seed=3)
    ase.io.write(root / "data.extxyz", structures)
    write_extxyz(root / "ref.extxyz", structures)
    save_artifact(tiny_model(), root / "model.hydra", species=[29, 79])
    return root


def _errors(pred, true) -> tuple[float, float]:
    d = np.asarray(pred, dtype=np.float64) - np.asarray(true, dtype=np.float64)
    return float(np.abs(d).mean()), float(np.sqrt((d**2).mean()))


def _expected(artifact: Path, data: Path) -> dict[str, tuple[float, float, int]]:
    """MAE, RMSE, count per head: one calculator call per structure, labels from ASE's getters."""
    calc = HydraCalculator(artifact)
    rows: dict[str, tuple[list, list]] = {
        k: ([], []) for k in ("energy", "energy_total", "atomic_energy", "forces", "stress")
    }
    for atoms in ase.io.read(data, ":"):
        out = calc(atoms.positions, atoms.numbers, cell=atoms.cell.array, forces=True, stress=True)
        n = len(atoms)
        energy = float(out["energy"][0])
        for name, pred, true in (
            ("energy", [energy / n], [atoms.get_potential_energy() / n]),
            ("energy_total", [energy], [atoms.get_potential_energy()]),
            ("atomic_energy", out["atomic_energy"].numpy(), atoms.get_potential_energies()),
            ("forces", out["forces"].numpy(), atoms.get_forces()),
            ("stress", [full_3x3_to_voigt_6_stress(out["stress"][0].numpy())], [atoms.get_stress()]),
        ):
            rows[name][0].append(np.asarray(pred).reshape(len(pred), -1))
            rows[name][1].append(np.asarray(true).reshape(len(pred), -1))
    return {k: (*_errors(np.concatenate(p), np.concatenate(t)), len(np.concatenate(p))) for k, (p, t) in rows.items()}


def _check(errors: dict, expected: dict) -> None:
    assert list(errors) == ["energy", "energy_total", "atomic_energy", "forces", "stress"]
    for name, (mae, rmse, count) in expected.items():
        assert math.isclose(errors[name]["mae"], mae, rel_tol=1e-9), name
        assert math.isclose(errors[name]["rmse"], rmse, rel_tol=1e-9), name
        assert errors[name]["count"] == count, name
    units = {k: errors[k]["unit"] for k in errors}
    assert units == {
        "energy": "eV/atom",
        "energy_total": "eV",
        "atomic_energy": "eV/atom",
        "forces": "eV/Å",
        "stress": "eV/Å³",
    }


def test_errors_equal_those_computed_from_the_calculator(files):
    """Batched flat calls (4 + 2 structures) give the errors of one call per structure; labels
    from a SinglePointCalculator (``energies`` mapped to the atomic_energy head)."""
    expected = _expected(files / "model.hydra", files / "data.extxyz")
    report = evaluate(
        files / "model.hydra", files / "data.extxyz", extra_keys=[("atomic_energy", "energies")], batch_size=4
    )
    _check(report.errors, expected)
    assert (report.structures, report.atoms) == (6, 6 * 32)
    assert report.labels == {"energy": "energy", "atomic_energy": "energies", "forces": "forces", "stress": "stress"}
    assert report.errors["forces"]["count"] == 6 * 32 and report.errors["energy"]["count"] == 6
    # the same from info / arrays labels, and from a list of Atoms with an index
    ref = evaluate(
        files / "model.hydra",
        files / "ref.extxyz",
        energy_key="REF_energy",
        forces_key="REF_forces",
        stress_key="REF_stress",
        batch_size=5,
    )
    for name in ("energy", "energy_total", "forces", "stress"):
        assert math.isclose(ref.errors[name]["mae"], expected[name][0], rel_tol=1e-9), name
    assert "atomic_energy" not in ref.errors  # its default label is absent on the first frame: not scored
    listed = evaluate(
        files / "model.hydra",
        ase.io.read(files / "data.extxyz", ":"),
        index="::2",
        extra_keys=[("atomic_energy", "energies")],
    )
    assert listed.structures == 3 and listed.errors["forces"]["count"] == 3 * 32


def test_cli_table_json_and_predictions(files, tmp_path, capsys):
    args = [str(files / "model.hydra"), str(files / "data.extxyz"), "--key", "atomic_energy=energies"]
    out_file = tmp_path / "predictions.extxyz"
    assert main([*args, "--batch-size", "4", "--output", str(out_file)]) == 0
    text = capsys.readouterr().out.splitlines()
    report = evaluate(files / "model.hydra", files / "data.extxyz", extra_keys=[("atomic_energy", "energies")])
    assert text[0] == f"{files / 'data.extxyz'}: errors per head"
    assert text[1:-1] == format_errors(report.errors) and text[-1] == f"predictions written to {out_file}"
    assert main([*args, "--json", "--index", ":3"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["structures"] == 3 and parsed["model"] == str(files / "model.hydra")
    assert set(parsed["mae"]) == set(report.errors) and parsed["mae"]["forces"]["count"] == 3 * 32

    written = ase.io.read(out_file, ":")
    calc = HydraCalculator(files / "model.hydra")
    for atoms, original in zip(written, ase.io.read(files / "data.extxyz", ":"), strict=True):
        out = calc(original.positions, original.numbers, cell=original.cell.array, forces=True, stress=True)
        assert math.isclose(atoms.info[PREFIX + "energy"], float(out["energy"][0]), rel_tol=1e-12)
        np.testing.assert_allclose(atoms.arrays[PREFIX + "forces"], out["forces"].numpy(), rtol=0, atol=1e-8)  # %.8f
        np.testing.assert_allclose(
            atoms.info[PREFIX + "stress"], full_3x3_to_voigt_6_stress(out["stress"][0].numpy()), rtol=1e-12, atol=1e-14
        )
        assert atoms.get_potential_energy() == original.get_potential_energy()  # the labels are kept
    assert [p.name for p in tmp_path.iterdir()] == ["predictions.extxyz"]  # no temporary file left


def test_console_script(files, tmp_path):
    """The ``hydragnn-evaluate`` entry point of hydra-infer's metadata, in a subprocess."""
    script = Path(sys.executable).parent / "hydragnn-evaluate"
    assert script.is_file(), "pip install -e packages/hydra-infer (or the wheel) installs the hydragnn-evaluate script"
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV)
    assert version.returncode == 0 and version.stdout.startswith("hydra-infer ")
    run = subprocess.run(
        [
            str(script),
            str(files / "model.hydra"),
            str(files / "ref.extxyz"),
            "--energy-key",
            "REF_energy",
            "--forces-key",
            "REF_forces",
            "--stress-key",
            "REF_stress",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=ENV,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = evaluate(
        files / "model.hydra",
        files / "ref.extxyz",
        energy_key="REF_energy",
        forces_key="REF_forces",
        stress_key="REF_stress",
    )
    parsed = json.loads(run.stdout)
    for name, row in report.errors.items():
        assert math.isclose(parsed["mae"][name]["mae"], row["mae"], rel_tol=1e-12), name


def test_training_keys_come_from_the_artifact(files, tmp_path):
    """A model trained on REF_ labels scores a REF_ file without any key option."""
    config = {"Dataset": {"energy_key": "REF_energy", "forces_key": "REF_forces", "stress_key": None}}
    save_artifact(tiny_model(), tmp_path / "model.hydra", species=[29, 79], extra={"config": config})
    report = evaluate(tmp_path / "model.hydra", files / "ref.extxyz")
    assert report.labels == {"energy": "REF_energy", "forces": "REF_forces"}  # stress: left out of training
    assert list(report.errors) == ["energy", "energy_total", "forces"]


def _error_line(stderr: str) -> str:
    """The CLI's last stderr line (the first calculator of a process prints its thread notice before)."""
    return stderr.strip().splitlines()[-1] if stderr.strip() else ""


def test_missing_label_names_the_key_the_frame_and_the_labels_present(files, tmp_path, capsys):
    frames = ase.io.read(files / "ref.extxyz", ":")
    del frames[4].info["REF_energy"]
    ase.io.write(tmp_path / "gap.extxyz", frames)
    with pytest.raises(SchemaError, match=r"gap.extxyz: frame 4: no label 'REF_energy'.*info keys \[.*'REF_stress'"):
        evaluate(files / "model.hydra", tmp_path / "gap.extxyz", energy_key="REF_energy", batch_size=2)
    assert main([str(files / "model.hydra"), str(tmp_path / "gap.extxyz"), "--energy-key", "REF_energy"]) == 2
    err = _error_line(capsys.readouterr().err)
    assert err.startswith("hydragnn-evaluate: error: ") and "frame 4" in err and "'REF_energy'" in err
    # a key given explicitly must be on the first frame; a structure the calculator refuses is named
    with pytest.raises(SchemaError, match="frame 0: no label 'nope'"):
        evaluate(files / "model.hydra", files / "data.extxyz", forces_key="nope")
    frames = ase.io.read(files / "ref.extxyz", ":")
    frames[2].numbers[0] = 1  # hydrogen: not a species of the model
    with pytest.raises(InferenceError, match=r"structure 2: numbers: .*\b1\b"):
        evaluate(files / "model.hydra", frames, energy_key="REF_energy", forces_key="REF_forces", batch_size=3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{root}/model.hydra", "{root}/absent.extxyz"], "absent.extxyz: no such file"),
        (["{root}/absent.hydra", "{root}/data.extxyz"], "absent.hydra: no such model artifact"),
        (["{root}/model.hydra", "{tmp}/garbage.extxyz"], "garbage.extxyz: frame 0: ASE cannot read it"),
        (["{root}/data.extxyz", "{root}/data.extxyz"], "not a HydraGNN model artifact"),
        (["{root}/model.hydra", "{root}/data.extxyz", "--output", "{tmp}/p.unknown"], "p.unknown: ASE cannot"),
        (["{root}/model.hydra", "{root}/data.extxyz", "--batch-size", "0"], "batch_size: expected an integer >= 1"),
        (["{root}/model.hydra", "{root}/data.extxyz", "--index", "50:"], "no structure to score"),
        (["{root}/model.hydra", "{root}/data.extxyz", "--device", "nonsense"], "device: 'nonsense'"),
        (["{root}/model.hydra", "{root}/data.extxyz", "--head", "nope"], "head: energy head 'nope'"),
    ],
)
def test_user_errors_exit_2(files, tmp_path, capsys, argv, message):
    (tmp_path / "garbage.extxyz").write_text("not\nan extxyz file\n")
    code = main([a.format(root=files, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    err = _error_line(err)
    assert code == 2 and err.startswith("hydragnn-evaluate: error: ") and message in err, err


def test_a_model_that_is_not_a_potential_scores_its_heads(tmp_path):
    """Graph heads and a node head named ``forces`` (a plain output, not -dE/dR) of a plain model,
    molecules without a cell, labels in ``atoms.info`` and ``atoms.arrays``."""
    variables = {
        "inputs": [
            {"name": "atomic_number", "level": "node", "dim": 1},
            {"name": "pos", "level": "node", "dim": 3, "role": "position"},
        ],
        "outputs": [
            {"name": "energy_per_atom", "level": "graph", "dim": 1},
            {"name": "au_fraction", "level": "graph", "dim": 1},
            {"name": "forces", "level": "node", "dim": 3},
        ],
    }
    model = tiny_model(
        variables=variables,
        enable_interatomic_potential=False,
        output_heads={"graph": {"num_sharedlayers": 1, "num_headlayers": 1}, "node": {"num_headlayers": 1}},
    )
    frames = []
    for seed in range(5):
        pos, numbers = cluster(6 + seed, seed=seed)
        atoms = ase.Atoms(numbers=numbers, positions=pos)
        atoms.calc = EMT()
        atoms.info["energy_per_atom"] = atoms.get_potential_energy() / len(atoms)
        atoms.info["au_fraction"] = float(np.mean(numbers == 79))
        atoms.arrays["forces"] = atoms.get_forces()
        atoms.calc = None
        frames.append(atoms)
    ase.io.write(tmp_path / "clusters.extxyz", frames)
    report = evaluate(model, tmp_path / "clusters.extxyz", batch_size=2)
    calc = HydraCalculator(model)
    assert calc.info.forces is None and list(report.errors) == ["energy_per_atom", "au_fraction", "forces"]
    for name in ("energy_per_atom", "au_fraction", "forces"):
        pred = np.concatenate([calc(a.positions, a.numbers)[name].numpy().reshape(-1) for a in frames])
        true = np.concatenate([np.reshape(a.info[name] if name in a.info else a.arrays[name], -1) for a in frames])
        mae, rmse = _errors(pred, true)
        assert math.isclose(report.errors[name]["mae"], mae, rel_tol=1e-9), name
        assert math.isclose(report.errors[name]["rmse"], rmse, rel_tol=1e-9), name
    assert report.errors["energy_per_atom"]["unit"] == "eV/atom" and report.errors["au_fraction"]["unit"] == ""
    assert report.errors["forces"]["count"] == sum(len(a) for a in frames)
    assert "energy_total" not in report.errors


def test_molecules_without_stress_labels_leave_stress_out(files, tmp_path):
    frames = []
    for seed in range(3):
        pos, numbers = cluster(8, seed=seed)
        atoms = ase.Atoms(numbers=numbers, positions=pos)
        atoms.calc = EMT()
        atoms.calc = SinglePointCalculator(atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces())
        frames.append(atoms)
    report = evaluate(files / "model.hydra", frames)
    assert list(report.errors) == ["energy", "energy_total", "forces"]


def test_runs_without_hydra_train(files):
    """hydra-infer alone: the module imports and scores with ``hydragnn.train`` unimportable."""
    code = (
        "import sys; sys.modules['hydragnn.train'] = None\n"
        "from hydragnn.infer.evaluate_cli import main\n"
        "code = main(sys.argv[1:])\n"
        "assert not any(m.startswith('hydragnn.train') and sys.modules[m] is not None for m in sys.modules)\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(files / "model.hydra"), str(files / "data.extxyz"), "--index", ":2"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=ENV,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "errors per head" in run.stdout and "eV/Å" in run.stdout
