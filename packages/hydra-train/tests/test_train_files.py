"""Training from files ASE reads: train / valid / test files, label keys, the conversion cache,
schema inference, reference energies, and prepared containers used as stored."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import ase.io
import pytest
from train_helpers import FILE_ARCH as ARCH

from hydragnn.data import DataError, write_dataset
from hydragnn.data.atomic_references import fit_average
from hydragnn.data.emt import generate_cuau_atoms, isolated_atom_frames, write_extxyz
from hydragnn.models import load_artifact
from hydragnn.train import ConfigError, load_config
from hydragnn.train.data import load_run_data
from hydragnn.train.pipeline import run_training

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """train (8 cells + Cu and Au isolated atoms), valid (3), test (3), with REF_* labels."""
    folder = tmp_path_factory.mktemp("data")
    atoms = generate_cuau_atoms(14, seed=11)
    write_extxyz(folder / "train.xyz", atoms[:8], config_type="bulk", extra_frames=isolated_atom_frames(["Cu", "Au"]))
    write_extxyz(folder / "valid.xyz", atoms[8:11])
    write_extxyz(folder / "test.xyz", atoms[11:])
    return folder


def _config(dataset: dict, **arch) -> dict:
    return {
        "Verbosity": {"level": 1},
        "Dataset": {"name": "mine", **dataset},
        "NeuralNetwork": {
            "Architecture": {**ARCH, **arch},
            "Training": {"num_epoch": 1, "batch_size": 4, "Optimizer": {"learning_rate": 0.005}},
        },
    }


KEYS = {"energy_key": "REF_energy", "forces_key": "REF_forces", "stress_key": "REF_stress"}


def test_one_command_from_extxyz_files_to_an_artifact(files, tmp_path):
    """The MACE-style invocation: three files, REF_* keys, no Variables, no reference energies."""
    cfg = _config({"train_file": "train.xyz", "valid_file": "valid.xyz", "test_file": "test.xyz", **KEYS})
    path = files / "run.json"  # relative file names are relative to the config's folder
    path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "run"
    code = "import sys; from hydragnn.train.cli import train_main; sys.exit(train_main())"
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "reference energies (isolated_atoms" in out.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [f["samples"] for f in metrics["data_files"]] == [8, 3, 3]
    assert set(metrics["test"]["mae"]) == {"energy", "forces", "stress"}
    assert metrics["test"]["mae"]["stress"]["count"] == 3
    iso = {a.get_chemical_symbols()[0]: a.info["REF_energy"] for a in isolated_atom_frames(["Cu", "Au"])}
    assert metrics["reference_energies"] == {"method": "isolated_atoms", "values": iso}
    model = load_artifact(run_dir / "model.hydra")
    assert model.config.mlip.reference_energies == ((29, iso["Cu"]), (79, iso["Au"]))
    assert model.manifest["species"] == [29, 79]
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["Dataset"]["train_file"] == str(files / "train.xyz")  # stored absolute
    assert [v["name"] for v in saved["Variables"]["outputs"]] == ["energy", "forces", "stress"]  # inferred, stored

    again = run_training(path, tmp_path / "again", verbosity=0)
    assert [f["cached"] for f in again["data_files"]] == [True, True, True]

    # serve-side check: hydragnn-predict on the test file reads it with the training keys
    code = "import sys; from hydragnn.train.cli import predict_main; sys.exit(predict_main())"
    out = subprocess.run(
        [sys.executable, "-c", code, str(run_dir / "model.hydra"), str(files / "test.xyz"), "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for head, r in metrics["test"]["mae"].items():
        assert math.isclose(result["mae"][head]["mae"], r["mae"], rel_tol=1e-5), head
        assert math.isclose(result["mae"][head]["rmse"], r["rmse"], rel_tol=1e-5), head


def test_one_file_split_and_average_reference_energies(files, tmp_path):
    cfg = _config({"path": str(files / "train.xyz"), "split": [0.5, 0.25, 0.25], **KEYS}, reference_energies="average")
    run = load_config(cfg)
    data = load_run_data(run)
    assert (len(data.train), len(data.val), len(data.test)) == (4, 2, 2)  # isolated atoms are no samples
    metrics = run_training(cfg, tmp_path, verbosity=0)
    fit = fit_average(data.train)
    assert metrics["reference_energies"]["method"] == "average"
    assert metrics["reference_energies"]["values"] == {"Cu": fit.energies[29], "Au": fit.energies[79]}


def test_valid_fraction_and_keys_that_leave_outputs_out(files):
    cfg = _config({"train_file": str(files / "train.xyz"), "valid_fraction": 0.25, **KEYS, "stress_key": None})
    data = load_run_data(load_config(cfg))
    assert (len(data.train), len(data.val), data.test) == (6, 2, None)
    assert [v.name for v in data.schema.outputs] == ["energy", "forces"]
    assert data.isolated_atoms[0][0] == 29


def test_missing_label_is_a_clean_cli_error(files, tmp_path):
    cfg = _config({"train_file": str(files / "train.xyz"), "energy_key": "DFT_energy"})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    code = "import sys; from hydragnn.train.cli import train_main; sys.exit(train_main())"
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "train.xyz: frame 0" in out.stderr and "no label 'DFT_energy'" in out.stderr
    assert "'REF_energy'" in out.stderr  # the labels the frame has


def test_prepared_container_is_used_as_stored(files, tmp_path):
    """A prepared dataset is authoritative: its stored x (here shifted) is not rebuilt by prepare."""
    data = load_run_data(load_config(_config({"train_file": str(files / "train.xyz"), **KEYS})))
    samples = [copy.copy(s) for s in data.train + data.val]
    for s in samples:
        s.x = s.x + 1000.0
    write_dataset(tmp_path / "prepared.pt", samples, "pt", schema=data.schema)
    cfg = _config({"path": str(tmp_path / "prepared.pt"), "split": [0.5, 0.25, 0.25]})
    loaded = load_run_data(load_config(cfg))
    assert loaded.schema == data.schema
    assert all(float(s.x.min()) > 1000.0 for s in loaded.train + loaded.val + loaded.test)
    wrong = copy.deepcopy(cfg)
    wrong["Variables"] = {**data.schema.to_dict(), "outputs": data.schema.to_dict()["outputs"][:2]}
    with pytest.raises(ConfigError, match="differ from the schema stored with the prepared dataset"):
        load_run_data(load_config(wrong))
    with pytest.raises(ConfigError, match="is a prepared dataset container; label keys"):
        load_run_data(load_config(_config({"path": str(tmp_path / "prepared.pt"), "energy_key": "E"})))


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"train_file": "a.xyz", "split": [0.8, 0.1, 0.1]}, "Dataset.split: a 'train_file' dataset takes"),
        ({"train_file": "a.xyz", "valid_file": "b.xyz", "valid_fraction": 0.2}, "Dataset.valid_fraction: only for"),
        ({"path": "a.xyz", "test_file": "b.xyz"}, "Dataset.test_file: only together with 'train_file'"),
        ({"generator": {}, "energy_key": "E"}, "Dataset.energy_key: only for files ASE reads"),
        ({"train_file": "a.xyz", "index": "1:x"}, "Dataset.index: expected an ase.io index"),
        (
            {"train_file": "a.xyz", "keys": {"energy": "E"}},
            "Dataset.keys.energy: give the label of 'energy' with 'energy_key'",
        ),
        ({"train_file": "a.xyz", "config_types": []}, "Dataset.config_types: expected a config type"),
        ({"train_file": "a.xyz", "cache_verify": "sha"}, "Dataset.cache_verify: expected one of"),
        ({"generator": {}, "cache_verify": "hash"}, "Dataset.cache_verify: only for files ASE reads"),
        ({}, "Dataset: give exactly one of"),
    ],
)
def test_dataset_section_errors(dataset, message):
    with pytest.raises(ConfigError) as err:
        load_config(_config(dataset))
    assert message in str(err.value)


def test_reference_energy_errors(files, tmp_path):
    cfg = _config({"train_file": str(files / "valid.xyz"), **KEYS}, reference_energies="isolated_atoms")
    with pytest.raises(
        ConfigError, match=r"reference_energies: the training data: no IsolatedAtom frame for \['Cu', 'Au'\]"
    ):
        run_training(cfg, tmp_path, verbosity=0)
    cfg = _config({"train_file": str(files / "valid.xyz"), **KEYS}, reference_energies={"Cu": -1.0})
    with pytest.raises(ConfigError, match=r"reference_energies: no value for \['Au'\]"):
        run_training(cfg, tmp_path, verbosity=0)
    with pytest.raises(ConfigError, match="reference_energies: expected one of"):
        load_config(_config({"train_file": "x.xyz"}, reference_energies="mean"))
    plain = _config({"train_file": "x.xyz"}, reference_energies="average")
    plain["NeuralNetwork"]["Architecture"]["enable_interatomic_potential"] = False
    with pytest.raises(ConfigError, match="'average' is for interatomic potentials"):
        load_config(plain)


def test_config_round_trip_with_files(files):
    run = load_config(
        _config(
            {
                "train_file": str(files / "train.xyz"),
                "valid_fraction": 0.2,
                **KEYS,
                "keys": {"q": "Q"},
                "config_types": "bulk",
                "index": 3,
            }
        )
    )
    again = load_config(run.to_dict())
    assert again.to_dict() == run.to_dict() and again.dataset == run.dataset
    assert run.dataset.index == "3" and run.dataset.config_types == ("bulk",)
    assert run.dataset.explicit_keys == {"energy", "forces", "stress", "q"}


def test_bad_structures_are_refused_by_training_and_predict(files, tmp_path):
    """Atomic number 150 in a stored container, a cell 20x too small in a file to predict: named
    errors (rc 2), never an IndexError deep in torch or millions of edges."""
    data = load_run_data(load_config(_config({"train_file": str(files / "train.xyz"), **KEYS})))
    samples = [copy.copy(s) for s in data.train + data.val]
    samples[3].atomic_number = samples[3].atomic_number.clone()
    samples[3].atomic_number[0] = 150
    write_dataset(tmp_path / "bad.pt", samples, "pt", schema=data.schema)
    cfg = _config({"path": str(tmp_path / "bad.pt"), "split": [0.5, 0.25, 0.25]})
    with pytest.raises(DataError, match=r"bad.pt: sample 3: 'atomic_number': atomic numbers \[150\]"):
        load_run_data(load_config(cfg))

    run_dir = tmp_path / "run"
    run_training(_config({"train_file": str(files / "train.xyz"), **KEYS}), run_dir, verbosity=0)
    atoms = ase.io.read(files / "test.xyz", index=0)
    atoms.set_cell(atoms.cell.array / 20, scale_atoms=True)
    ase.io.write(tmp_path / "tiny.xyz", atoms, format="extxyz")
    code = "import sys; from hydragnn.train.cli import predict_main; sys.exit(predict_main())"
    out = subprocess.run(
        [sys.executable, "-c", code, str(run_dir / "model.hydra"), str(tmp_path / "tiny.xyz")],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "too small for the cutoff" in out.stderr


def test_resume_with_the_config_the_run_wrote(files, tmp_path):
    """The run folder's own ``config.json`` (which carries the inferred schema as ``Variables``)
    resumes the run: the data is identified by its content, not by the cache entry's name."""
    cfg = _config({"train_file": str(files / "train.xyz"), "valid_file": str(files / "valid.xyz"), **KEYS})
    cfg["NeuralNetwork"]["Training"]["Checkpoint"] = {"every": 1}
    run_dir = tmp_path / "run"
    run_training(cfg, run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    assert "Variables" in saved and "Variables" not in cfg
    saved["NeuralNetwork"]["Training"]["num_epoch"] = 2
    resumed = run_training(saved, run_dir, resume=True)
    assert [h["epoch"] for h in resumed["history"]] == [0, 1]


def test_cache_verify_hash_sees_a_large_file_edited_to_the_same_size(files, tmp_path, monkeypatch):
    """``cache_verify: "hash"`` reaches the conversion: a file rewritten to the same size with its
    time restored is converted again (every file counts as large here, so "auto" trusts the time)."""
    from hydragnn.data.io import conversion_cache

    monkeypatch.setattr(conversion_cache, "HASH_ALWAYS_BELOW", 0)
    path = tmp_path / "train.xyz"
    path.write_text((files / "valid.xyz").read_text())
    cfg = _config({"train_file": str(path), "valid_fraction": 0.34, **KEYS})
    first = load_run_data(load_config(cfg))
    stat = path.stat()
    text = path.read_text()
    at = text.index("REF_energy=") + len("REF_energy=") + 3
    path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_run_data(load_config(cfg)).files[0]["cached"]
    hashed = load_config({**cfg, "Dataset": {**cfg["Dataset"], "cache_verify": "hash"}})
    assert hashed.dataset.cache_verify == "hash" and load_config(hashed.to_dict()).dataset == hashed.dataset
    again = load_run_data(hashed)
    assert not again.files[0]["cached"] and again.files[0]["sha256"] != first.files[0]["sha256"]


def test_sources_inherit_cache_verify(files):
    cfg = _config(
        {
            "cache_verify": "hash",
            "sources": [
                {"name": "a", "train_file": str(files / "valid.xyz"), **KEYS},
                {"name": "b", "train_file": str(files / "test.xyz"), "cache_verify": "auto", **KEYS},
            ],
        },
        energy_heads=["a", "b"],
    )
    run = load_config(cfg)
    assert [s.cache_verify for s in run.dataset.sources] == ["hash", "auto"]
    assert load_config(run.to_dict()).dataset == run.dataset
