"""``hydragnn-predict`` (hydra-train) and ``hydragnn-evaluate`` (hydra-infer) report the same errors,
in the same table, for the same model and file (both compute them with ``hydragnn.models.metrics``)."""

from __future__ import annotations

import copy
import json
import math

import ase.io
import pytest
import torch
from train_helpers import MLIP_ARCH

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES, generate_cuau_atoms
from hydragnn.models import build_model, save_artifact
from hydragnn.train.cli import predict_main

pytest.importorskip("hydragnn.infer", reason="hydra-infer is not installed")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An fp64 SchNet MLIP with reference energies (energy, atomic_energy, forces, stress) and 5
    EMT Cu-Au cells, every label in the extxyz file (``atomic_energy`` as an array)."""
    root = tmp_path_factory.mktemp("agree")
    variables = copy.deepcopy(CUAU_VARIABLES)
    variables["outputs"].append({"name": "stress", "level": "graph", "dim": 6})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model({**MLIP_ARCH, "precision": "fp64", "task_weights": [1.0] * 4}, Schema.from_dict(variables))
    save_artifact(model, root / "model.hydra", species=[29, 79])
    structures = generate_cuau_atoms(5, seed=2)
    for atoms in structures:
        atoms.arrays["atomic_energy"] = atoms.calc.results["energies"]
    ase.io.write(root / "data.extxyz", structures)
    return root


def test_predict_and_evaluate_agree(files, capsys):
    from hydragnn.infer.evaluate_cli import main as evaluate_main

    args = [str(files / "model.hydra"), str(files / "data.extxyz")]
    assert predict_main([*args, "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mae"]
    assert evaluate_main([*args, "--json", "--batch-size", "2"]) == 0
    evaluated = json.loads(capsys.readouterr().out)["mae"]
    assert set(predicted) == {"energy", "atomic_energy", "forces", "stress"}
    assert set(evaluated) == {*predicted, "energy_total"}
    for head, row in predicted.items():  # predict collects float32 copies of the outputs: 1e-5
        assert math.isclose(evaluated[head]["mae"], row["mae"], rel_tol=1e-5), head
        assert math.isclose(evaluated[head]["rmse"], row["rmse"], rel_tol=1e-5), head
        assert evaluated[head]["unit"] == row["unit"] and evaluated[head]["count"] == row["count"], head
    # the tables: the same header and rows (the words of each line: the name column is as wide as the
    # longest head name), evaluate adding the total energy in eV after the energy
    assert predict_main(args) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert evaluate_main(args) == 0
    other = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [words[0] for words in other] == [*[w[0] for w in table[:3]], "energy_total", *[w[0] for w in table[3:]]]
    assert other[3][-1] == "eV"
    other.pop(3)
    assert table[:2] == other[:2] == [[f"{args[1]}:", "errors", "per", "head"], ["head", "MAE", "RMSE", "unit"]]
    for mine, theirs in zip(other[2:], table[2:], strict=True):
        assert mine[0] == theirs[0] and mine[3:] == theirs[3:]
        for a, b in zip(mine[1:3], theirs[1:3], strict=True):
            assert math.isclose(float(a), float(b), rel_tol=1e-4), (mine, theirs)


def test_predict_refuses_species_the_model_never_saw(files, tmp_path, capsys):
    """A Cu-Au model scored on a cell with a Ni atom: refused, naming the structure and the species
    (the calculator and hydragnn-evaluate refuse them too)."""
    from ase.calculators.emt import EMT

    structures = generate_cuau_atoms(3, seed=4)
    structures[1].numbers[0] = 28
    for atoms in structures:
        atoms.calc = EMT()
        atoms.get_forces()
        atoms.arrays["atomic_energy"] = atoms.calc.results["energies"]
    ase.io.write(tmp_path / "nickel.extxyz", structures)
    assert predict_main([str(files / "model.hydra"), str(tmp_path / "nickel.extxyz")]) == 2
    err = capsys.readouterr().err
    assert "structure 1 holds species [28] that the model was not trained on (its species: [29, 79])" in err


def test_predict_output_paths(files, tmp_path, capsys):
    """--output: a folder there is refused before any work; a missing folder is created; a
    file-size limit is an error (rc 2, the errors still printed) with no file left behind."""
    import subprocess
    import sys

    args = [str(files / "model.hydra"), str(files / "data.extxyz")]
    (tmp_path / "folder").mkdir()
    assert predict_main([*args, "--output", str(tmp_path / "folder")]) == 2
    assert (
        "--output" in (err := capsys.readouterr()).err and "is a folder" in err.err and "errors per head" not in err.out
    )
    out = tmp_path / "new" / "p.pt"
    assert predict_main([*args, "--output", str(out)]) == 0
    saved = torch.load(out, weights_only=True)
    assert set(saved) == {"targets", "predictions"}
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512)); "
        "from hydragnn.train.cli import predict_main; "
        f"sys.exit(predict_main([*{args!r}, '--output', {str(tmp_path / 'capped' / 'p.pt')!r}]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "cannot write it: File too large" in run.stderr and "errors per head" in run.stdout
    assert list((tmp_path / "capped").iterdir()) == []
