"""Several data sources, one energy head each: fine-tune on your data while replaying a slice of
the original data, per-head references and errors, config rules."""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import FILE_ARCH as ARCH
from train_helpers import REF_KEYS as KEYS

from hydragnn.data.emt import generate_cuau_atoms, isolated_atom_frames, write_extxyz
from hydragnn.models import load_artifact
from hydragnn.train import ConfigError, load_config
from hydragnn.train.data import load_run_data
from hydragnn.train.pipeline import run_training
from hydragnn.train.predict import predict


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """original.xyz: pure Cu (+ free atoms); mine.xyz: Cu-Au; stress.xyz: Cu-Au with stress labels."""
    folder = tmp_path_factory.mktemp("sources")
    write_extxyz(
        folder / "original.xyz",
        generate_cuau_atoms(8, seed=1, compositions=(0.0,)),
        extra_frames=isolated_atom_frames(["Cu"]),
    )
    write_extxyz(folder / "mine.xyz", generate_cuau_atoms(8, seed=2, compositions=(0.25, 0.5)))
    return folder


def _sources(files, **extra) -> list[dict]:
    return [
        {"name": "mine", "train_file": str(files / "mine.xyz"), "valid_fraction": 0.25, **KEYS},
        {
            "name": "replay",
            "path": str(files / "original.xyz"),
            "index": ":6",
            "split": [0.5, 0.25, 0.25],
            "weight": 0.5,
            **KEYS,
            **extra,
        },
    ]


def _config(dataset: dict, arch=ARCH, **training) -> dict:
    return {
        "Verbosity": {"level": 0},
        "Dataset": {"name": "two", **dataset},
        "NeuralNetwork": {
            **({"Architecture": copy.deepcopy(arch)} if arch is not None else {}),
            "Training": {"num_epoch": 1, "batch_size": 2, "Optimizer": {"learning_rate": 0.01}, **training},
        },
    }


def test_sources_are_tagged_and_merged(files):
    data = load_run_data(load_config(_config({"sources": _sources(files)})))
    assert data.heads == ["mine", "replay"] and data.head_weights == [1.0, 0.5]
    assert [len(p.train) for p in data.parts] == [6, 3] and len(data.train) == 9
    assert sorted(int(s.head) for s in data.train) == [0] * 6 + [1] * 3
    assert data.parts[1].isolated_atoms[0][0] == 29 and data.test and int(data.test[0].head) == 1


def test_fine_tune_on_my_data_while_replaying_the_original(files, tmp_path):
    """A one-head potential trained on the original data is fine-tuned with two heads: each head
    starts as the trained readout; references are each source's own; errors are reported per head."""
    base = _config({"train_file": str(files / "original.xyz"), "valid_fraction": 0.25, **KEYS})
    run_training(base, tmp_path / "base")
    artifact = tmp_path / "base" / "model.hydra"
    tuned = _config(
        {"sources": _sources(files)},
        arch=None,
        init_from=str(artifact),
        FineTune={"new_species": "add"},
    )
    tuned["NeuralNetwork"]["Architecture"] = dict(load_config(tuned).architecture, reference_energies="average")
    metrics = run_training(tuned, tmp_path / "tuned")
    model = load_artifact(tmp_path / "tuned" / "model.hydra")
    assert model.energy_head_names == ["mine", "replay"]
    assert metrics["energy_heads"] == {"mine": 1.0, "replay": 0.5}
    assert set(metrics["reference_energies"]) == {"mine", "replay"}
    assert set(metrics["reference_energies"]["mine"]["values"]) == {"Cu", "Au"}
    assert set(metrics["reference_energies"]["replay"]["values"]) == {"Cu"}  # the replay data has no Au
    assert set(metrics["test_by_head"]) == {"replay"}  # "mine" has no test file
    assert metrics["test_by_head"]["replay"]["forces"]["unit"] == "eV/Å"
    # serve the replay head: hydragnn-predict on the original file
    result, _, _ = predict(tmp_path / "tuned" / "model.hydra", files / "original.xyz", head="replay")
    assert result["mae"]["energy"]["count"] == 8
    mine, _, _ = predict(tmp_path / "tuned" / "model.hydra", files / "original.xyz")
    assert mine["mae"]["energy"]["mae"] != result["mae"]["energy"]["mae"]  # the default head is "mine"


def test_readouts_start_from_the_artifact(files, tmp_path):
    from hydragnn.models import build_model
    from hydragnn.train.finetune import FineTuneConfig, initialise_from, load_base

    run_training(_config({"train_file": str(files / "original.xyz"), **KEYS}), tmp_path / "b")
    base = load_artifact(tmp_path / "b" / "model.hydra")
    run = load_config(_config({"sources": _sources(files)}))
    model = build_model(run.model_config.raw | {"energy_heads": ["mine", "replay"]}, base.schema)
    initialise_from(
        model,
        load_base(tmp_path / "b" / "model.hydra", base.schema, FineTuneConfig(new_species="add"), [29, 79]),
        FineTuneConfig(),
    )
    last = [k for k in base.state_dict() if k.startswith("energy_head.atom.net")][-2:]
    for key in last:
        for row in model.state_dict()[key]:
            torch.testing.assert_close(row, base.state_dict()[key][0])


@pytest.mark.parametrize(
    ("dataset", "arch", "message"),
    [
        ({"sources": [{"name": "a", "generator": {}}, {"name": "a", "generator": {}}]}, ARCH, "names must be unique"),
        ({"sources": [{"generator": {}}]}, ARCH, "Dataset.sources[0]: expected an object with a 'name'"),
        ({"sources": [], "name": "x"}, ARCH, "Dataset.sources: expected a non-empty list"),
        (
            {"sources": [{"name": "a", "generator": {}}], "generator": {}},
            ARCH,
            "Dataset.generator: give it inside each",
        ),
        ({"generator": {}, "weight": 2.0}, ARCH, "Dataset.weight: only for an entry of Dataset.sources"),
        (
            {"sources": [{"name": "a", "generator": {}}]},
            {**ARCH, "energy_heads": ["b"]},
            "must be the Dataset.sources names",
        ),
        (
            {"sources": [{"name": "a", "generator": {}}]},
            {**ARCH, "enable_interatomic_potential": False},
            "Dataset.sources: one energy head per source is for interatomic potentials",
        ),
    ],
)
def test_sources_config_errors(dataset, arch, message):
    with pytest.raises(ConfigError) as err:
        load_config(_config(dataset, arch=arch))
    assert message in str(err.value)


def test_sources_must_label_the_same_outputs(files, tmp_path):
    stress = [dict(s, stress_key="REF_stress") if s["name"] == "mine" else s for s in _sources(files)]
    write_extxyz(tmp_path / "mine.xyz", generate_cuau_atoms(4, seed=5))
    stress[0]["train_file"] = str(tmp_path / "mine.xyz")
    with pytest.raises(ConfigError, match=r"sources\[1\] \('replay'\): its outputs \['energy', 'forces'\] differ"):
        load_run_data(load_config(_config({"sources": stress})))
