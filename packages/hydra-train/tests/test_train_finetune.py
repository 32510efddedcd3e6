"""Fine-tuning from a model artifact: the artifact's architecture, heads kept or replaced, a frozen
trunk, new species refused or added, a trunk that does not fit."""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import FILE_ARCH as ARCH
from train_helpers import REF_KEYS as KEYS

from hydragnn.data.emt import generate_cuau_atoms, write_extxyz
from hydragnn.models import build_model, load_artifact
from hydragnn.train import ConfigError, load_config
from hydragnn.train.finetune import TRUNK, FineTuneConfig, initialise_from, load_base
from hydragnn.train.pipeline import run_training


def _config(train_file, arch=ARCH, **training) -> dict:
    return {
        "Verbosity": {"level": 0},
        "Dataset": {"name": "ft", "train_file": str(train_file), "valid_fraction": 0.25, **KEYS},
        "NeuralNetwork": {
            **({"Architecture": copy.deepcopy(arch)} if arch is not None else {}),
            "Training": {"num_epoch": 1, "batch_size": 2, "Optimizer": {"learning_rate": 0.01}, **training},
        },
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny potential trained on pure-Cu cells, and files of Cu (same species) and CuAu (new Au)."""
    folder = tmp_path_factory.mktemp("ft")
    write_extxyz(folder / "cu.xyz", generate_cuau_atoms(6, seed=1, compositions=(0.0,)))
    write_extxyz(folder / "cu2.xyz", generate_cuau_atoms(4, seed=2, compositions=(0.0,)))
    write_extxyz(folder / "cuau.xyz", generate_cuau_atoms(4, seed=3, compositions=(0.25, 0.5)))
    run_training(_config(folder / "cu.xyz"), folder / "base")
    return folder


def _state(model, prefix=TRUNK):
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(prefix)}


def test_architecture_comes_from_the_artifact_and_heads_are_kept_or_replaced(base):
    artifact = base / "base" / "model.hydra"
    run = load_config(_config(base / "cu2.xyz", arch=None, energy_weight=5.0), init_from=artifact)
    trained = load_artifact(artifact)
    assert run.model_config.hidden_dim == 8 and run.model_config.loss.energy_weight == 5.0
    assert run.reference_energies == "given"  # the artifact's values
    for heads in ("keep", "replace"):
        torch.manual_seed(7)
        model = build_model(run.model_config, trained.schema)
        lines: list[str] = []
        record = initialise_from(
            model,
            load_base(artifact, trained.schema, FineTuneConfig(), [29]),
            FineTuneConfig(heads=heads),
            log=lines.append,
        )
        assert f"{len(record['fresh'])} fresh ({record['fresh'][0]}" in lines[-1]  # the log names them
        base_state, state = trained.state_dict(), model.state_dict()
        for key, value in state.items():
            same = torch.equal(value, base_state[key])
            if key.startswith(TRUNK) or (heads == "keep" and key != "energy_head.reference"):
                assert same, (heads, key)
            elif key.startswith("energy_head.atom"):
                assert not same, (heads, key)
        assert record["copied"] > 0 and (heads == "keep") == (record["fresh"] == ["energy_head.reference"])


def test_frozen_trunk_stays_the_artifacts(base, tmp_path):
    artifact = base / "base" / "model.hydra"
    cfg = _config(base / "cu2.xyz", arch=None, init_from=str(artifact), FineTune={"freeze_encoder": True})
    metrics = run_training(cfg, tmp_path)
    tuned, trained = load_artifact(tmp_path / "model.hydra"), load_artifact(artifact)
    assert metrics["init_from"]["trainable_parameters"] < metrics["num_parameters"]
    for key, value in _state(tuned).items():
        assert torch.equal(value, trained.state_dict()[key]), key
    heads = _state(tuned, "energy_head.atom")
    assert any(not torch.equal(v, trained.state_dict()[k]) for k, v in heads.items())


def test_new_species_are_refused_unless_added(base, tmp_path):
    artifact = base / "base" / "model.hydra"
    with pytest.raises(ConfigError, match=r"species the artifact was not trained on: \['Au \(Z=79\)'\].*new_species"):
        run_training(_config(base / "cuau.xyz", arch=None, init_from=str(artifact)), tmp_path / "a")
    added = _config(base / "cuau.xyz", arch=None, init_from=str(artifact), FineTune={"new_species": "add"})
    # the artifact's reference energies know only Cu: fit them again on the new data
    added["NeuralNetwork"]["Architecture"] = dict(load_config(added).architecture, reference_energies="average")
    metrics = run_training(added, tmp_path / "b")
    assert metrics["init_from"]["new_species"] == [79] and metrics["reference_energies"]["method"] == "average"
    assert load_artifact(tmp_path / "b" / "model.hydra").manifest["species"] == [29, 79]


def test_a_trunk_that_does_not_fit_is_named(base, tmp_path):
    wider = dict(ARCH, hidden_dim=16)
    with pytest.raises(ConfigError, match=r"trunk tensor 'encoder\..*' is shape .* in the artifact"):
        run_training(_config(base / "cu2.xyz", arch=wider, init_from=str(base / "base" / "model.hydra")), tmp_path)
    with pytest.raises(ConfigError, match="FineTune: only with NeuralNetwork.Training.init_from"):
        load_config(_config(base / "cu2.xyz", FineTune={"heads": "replace"}))
    with pytest.raises(ConfigError, match="Architecture: required section missing"):
        load_config(_config(base / "cu2.xyz", arch=None))
    with pytest.raises(ConfigError, match="init_from: .*no such|init_from: .*cannot read"):
        load_config(_config(base / "cu2.xyz", arch=None, init_from="missing.hydra"))


def test_init_from_on_the_command_line(base, tmp_path):
    import json
    import subprocess
    import sys

    path = tmp_path / "ft.json"
    path.write_text(json.dumps(_config(base / "cu2.xyz", arch=None)))
    code = "import sys; from hydragnn.train.cli import train_main; sys.exit(train_main())"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(path),
            "--run-dir",
            str(tmp_path / "run"),
            "--init-from",
            str(base / "base" / "model.hydra"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["NeuralNetwork"]["Training"]["init_from"] == str(base / "base" / "model.hydra")
    assert saved["NeuralNetwork"]["Architecture"]["hidden_dim"] == 8  # the artifact's architecture
