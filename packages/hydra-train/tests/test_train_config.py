"""The JSON config: validation errors name the JSON path; defaults filled; round trip."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from train_helpers import config

from hydragnn.train import ConfigError, RunConfig, load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _with(cfg: dict, path: str, value) -> dict:
    cfg = copy.deepcopy(cfg)
    keys = path.split(".")
    node = cfg
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return cfg


def test_defaults_filled_and_round_trip(tmp_path):
    cfg = load_config(config())
    assert isinstance(cfg, RunConfig)
    tr = cfg.training
    assert tr.optimizer.type == "Adam" and tr.optimizer.weight_decay == 0.0
    assert tr.scheduler.type == "ReduceLROnPlateau" and dict(tr.scheduler.options)["factor"] == 0.5
    assert tr.parallelism.strategy == "none" and tr.parallelism.timeout_s == 300
    assert not tr.local_sgd.enabled and tr.local_sgd.synchronization_period == 4
    assert tr.nan_policy == "error" and tr.checkpoint.enabled
    assert cfg.dataset.cutoff == 4.0  # the model radius
    assert cfg.architecture["precision"] == "fp32"  # Architecture defaults filled
    full = cfg.to_dict()
    json.dumps(full)
    again = load_config(full)
    assert again.to_dict() == full
    cfg.save(tmp_path / "config.json")
    assert load_config(tmp_path / "config.json").to_dict() == full


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("NeuralNetwork.Training.Optimizer.lr", 0.1, "NeuralNetwork.Training.Optimizer.lr: unknown key"),
        ("NeuralNetwork.Training.num_epoch", "10", "NeuralNetwork.Training.num_epoch: expected int"),
        ("NeuralNetwork.Training.batch_size", 0, "NeuralNetwork.Training.batch_size: expected a value >= 1"),
        ("NeuralNetwork.Training.Optimizer.type", "Lion", "NeuralNetwork.Training.Optimizer.type: expected one of"),
        (
            "NeuralNetwork.Training.Scheduler",
            {"type": "CosineAnnealingLR", "patience": 3},
            "NeuralNetwork.Training.Scheduler.patience: unknown key",
        ),
        ("NeuralNetwork.Training.LocalSGD", {"enabled": True}, "NeuralNetwork.Training.LocalSGD.enabled"),
        (
            "NeuralNetwork.Training.Optimizer.use_zero_redundancy",
            True,
            "NeuralNetwork.Training.Optimizer.use_zero_redundancy",
        ),
        ("NeuralNetwork.Training.Parallelism.zero_stage", 2, "NeuralNetwork.Training.Parallelism.zero_stage"),
        ("NeuralNetwork.Training.Parallelism.strategy", "horovod", "NeuralNetwork.Training.Parallelism.strategy"),
        ("NeuralNetwork.Training.nan_policy", "ignore", "NeuralNetwork.Training.nan_policy"),
        ("NeuralNetwork.Training.precision", "fp64", "NeuralNetwork.Training.precision: 'fp64' conflicts"),
        ("NeuralNetwork.Architecture.hidden_dim", -4, "NeuralNetwork.Architecture.hidden_dim"),
        (
            "NeuralNetwork.Architecture.hiden_dim",
            4,
            "NeuralNetwork.Architecture.hiden_dim: unknown key (did you mean 'hidden_dim'?); neither a common key",
        ),
        ("Dataset.split", [0.5, 0.2, 0.2], "Dataset.split"),
        ("Dataset.path", "/x", "Dataset: give exactly one of"),
        ("Verbosity.level", 7, "Verbosity.level"),
        ("NeuralNetwork.Training.Batching", {"mode": "node_budget"}, "NeuralNetwork.Training.Batching"),
        (
            "NeuralNetwork.Training.Batching",
            {"mode": "node_budget", "max_nodez": 9},
            "NeuralNetwork.Training.Batching.max_nodez: unknown key",
        ),
        ("Extra", 1, "config.Extra: unknown key"),
        ("NeuralNetwork.Training.Optimizer.learning_rate", float("nan"), "learning_rate: expected a finite float"),
        ("NeuralNetwork.Training.clip_grad_norm", float("inf"), "clip_grad_norm: expected a finite float"),
    ],
)
def test_invalid_names_the_path(path, value, expected):
    base = config()
    if path == "NeuralNetwork.Training.precision":
        base["NeuralNetwork"]["Architecture"]["precision"] = "fp32"
    with pytest.raises(ConfigError) as info:
        load_config(_with(base, path, value))
    assert expected in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("NeuralNetwork.Training.SEED", 1, "NeuralNetwork.Training.SEED: unknown key (did you mean 'seed'?); allowed"),
        ("NeuralNetwork.Training.num_epochs", 3, "Training.num_epochs: unknown key (did you mean 'num_epoch'?)"),
        (
            "NeuralNetwork.Training.Optimizer.learnig_rate",
            0.1,
            "Optimizer.learnig_rate: unknown key (did you mean 'learning_rate'?)",
        ),
        ("NeuralNetwork.Architecture.hiden_dim", 4, "Architecture.hiden_dim: unknown key (did you mean 'hidden_dim'?)"),
        ("NeuralNetwork.Architecture.Radius", 4.0, "Architecture.Radius: unknown key (did you mean 'radius'?)"),
        ("Dataset.splt", [0.5, 0.25, 0.25], "Dataset.splt: unknown key (did you mean 'split'?); allowed"),
        ("Variables.output", [], "Variables: unknown key(s) ['output'] (did you mean 'outputs'?); allowed keys are"),
        ("Verbosity.levl", 1, "Verbosity.levl: unknown key (did you mean 'level'?)"),
    ],
)
def test_unknown_keys_suggest_the_nearest_allowed_key(path, value, expected):
    with pytest.raises(ConfigError) as info:
        load_config(_with(config(), path, value))
    assert expected in str(info.value), str(info.value)


def test_a_variable_key_typo_and_an_unrelated_key():
    cfg = config()
    cfg["Variables"]["inputs"][0]["Dim"] = cfg["Variables"]["inputs"][0].pop("dim")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['Dim'\] \(did you mean 'dim'\?\); allowed keys"):
        load_config(cfg)
    with pytest.raises(ConfigError) as info:  # nothing close: the allowed list alone
        load_config(_with(config(), "NeuralNetwork.Training.zzz", 1))
    assert "Training.zzz: unknown key; allowed: [" in str(info.value)


def test_variables_error_is_a_config_error():
    cfg = config()
    cfg["Variables"]["outputs"][0]["level"] = "atom"
    with pytest.raises(ConfigError, match="Variables"):
        load_config(cfg)


def test_a_schema_without_outputs_is_refused_for_training():
    # hydra-data accepts a schema without outputs (samples for prediction); a training run does not
    cfg = config()
    cfg["Variables"]["outputs"] = []
    with pytest.raises(ConfigError, match=r"^Variables.outputs: a training run needs at least one output to train on"):
        load_config(cfg)


def test_training_model_keys_are_copied_into_the_architecture():
    cfg = config(precision="fp64", loss_function_type="mae")
    run = load_config(cfg)
    assert run.model_config.precision == "fp64" and run.model_config.loss.function == "mae"


def test_legacy_early_stopping_and_checkpoint_keys():
    run = load_config(config(EarlyStopping=True, patience=3, Checkpoint=False, checkpoint_warmup=2))
    assert run.training.early_stopping.enabled and run.training.early_stopping.patience == 3
    assert not run.training.checkpoint.enabled and run.training.checkpoint.warmup == 2
    with pytest.raises(ConfigError, match="patience"):
        load_config(config(EarlyStopping={"enabled": True, "patience": 4}, patience=3))


@pytest.mark.parametrize(
    "name",
    [
        "cuau_mlip.json",
        "multihead_graph.json",
        "conditioning_charge_spin.json",
        "own_data/train.json",
        "own_data/molecules_mace.json",
        "fept_lsms.json",
    ],
)
def test_examples_parse(name):
    run = load_config(EXAMPLES / name)
    assert load_config(run.to_dict()).to_dict() == run.to_dict()


def test_attention_heads_must_divide_hidden_dim():
    cfg = config()
    cfg["NeuralNetwork"]["Architecture"].update(global_attn_engine="GPS", hidden_dim=30, global_attn_heads=4)
    with pytest.raises(ConfigError, match=r"NeuralNetwork\.Architecture\.global_attn_heads: hidden_dim \(30\)"):
        load_config(cfg)
    cfg["NeuralNetwork"]["Training"]["global_attn_redraw_interval"] = 0
    cfg["NeuralNetwork"]["Architecture"]["global_attn_heads"] = 5
    with pytest.raises(ConfigError, match=r"NeuralNetwork\.Training\.global_attn_redraw_interval"):
        load_config(cfg)


def test_nan_written_in_a_config_file_is_refused(tmp_path):
    """json reads the non-standard NaN / Infinity literals as floats: they must not pass."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config()).replace('"radius": 4.0', '"radius": NaN'))
    assert "NaN" in path.read_text()
    with pytest.raises(ConfigError, match="radius: expected a finite float"):
        load_config(path)


def _mlip_config(**arch) -> dict:
    cfg = config("mlip")
    cfg["NeuralNetwork"]["Architecture"].pop("task_weights")
    cfg["NeuralNetwork"]["Architecture"].update(arch)
    cfg["NeuralNetwork"]["Training"] = {"num_epoch": 5}
    return cfg


def test_an_interatomic_potential_gets_the_mlip_setting_for_what_it_leaves_out():
    from hydragnn.train.mlip_defaults import MLIP_ARCHITECTURE, MLIP_LOSS_WEIGHTS, MLIP_TRAINING

    cfg = load_config(_mlip_config())
    tr = cfg.training
    assert tr.optimizer.type == MLIP_TRAINING["Optimizer"]["type"] == "AdamW"
    assert tr.optimizer.learning_rate == MLIP_TRAINING["Optimizer"]["learning_rate"]
    assert tr.ema.enabled and tr.second_stage.enabled and tr.clip_grad_norm == MLIP_TRAINING["clip_grad_norm"]
    assert tr.scheduler.warmup_steps == MLIP_TRAINING["Scheduler"]["warmup_steps"]
    weights = {k: cfg.architecture[k] for k in MLIP_LOSS_WEIGHTS}
    assert weights == MLIP_LOSS_WEIGHTS and cfg.model_config.loss.energy_weight == MLIP_LOSS_WEIGHTS["energy_weight"]
    assert cfg.auto_committee and cfg.model_config.committee == 1  # sized by the pipeline (committee_size)
    arch_keys = {f"Architecture.{k}" for k in (*MLIP_ARCHITECTURE, *MLIP_LOSS_WEIGHTS)}
    assert set(cfg.mlip_defaults) == {f"Training.{k}" for k in MLIP_TRAINING} | arch_keys
    assert cfg.with_committee(2).to_dict()["NeuralNetwork"]["Architecture"]["committee"] == 2
    assert load_config(cfg.with_committee(2).to_dict()).model_config.committee == 2
    again = load_config(cfg.to_dict())
    assert again == cfg and again.mlip_defaults == ()  # the completed config leaves nothing out

    # a section given replaces the default one; a weight given wins; task_weights stop the weights
    mine = _mlip_config(energy_weight=2.0)
    mine["NeuralNetwork"]["Training"].update(EMA={"enabled": False}, Optimizer={"type": "SGD", "learning_rate": 0.1})
    cfg = load_config(mine)
    assert not cfg.training.ema.enabled and cfg.training.optimizer.type == "SGD"
    assert cfg.architecture["energy_weight"] == 2.0 and cfg.architecture["forces_weight"] == 100.0
    assert "Training.EMA" not in cfg.mlip_defaults and "Training.SecondStage" in cfg.mlip_defaults
    weighted = load_config(_mlip_config(task_weights=[3.0, 1.0, 1.0]))
    assert not any(p.startswith("Architecture.") and "weight" in p for p in weighted.mlip_defaults)
    assert load_config(_mlip_config(committee=2)).model_config.committee == 2  # a count given wins
    sharded = _mlip_config()
    sharded["NeuralNetwork"]["Training"]["Parallelism"] = {"strategy": "fsdp"}
    cfg = load_config(sharded)
    assert not cfg.training.ema.enabled and "Training.EMA" not in cfg.mlip_defaults


def test_other_models_keep_the_generic_defaults():
    cfg = load_config(config("graph"))
    assert cfg.mlip_defaults == () and not cfg.training.ema.enabled and not cfg.training.second_stage.enabled
