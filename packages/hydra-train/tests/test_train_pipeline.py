"""``run_training`` in-process: a multi-head graph task in fp64, resumed through the pipeline."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import config

from hydragnn.models import load_artifact
from hydragnn.train import TrainingAborted
from hydragnn.train.pipeline import run_training
from hydragnn.train.split import split_indices


def test_split_is_deterministic_and_complete():
    a = split_indices(20, (0.6, 0.2, 0.2), seed=3)
    assert a == split_indices(20, (0.6, 0.2, 0.2), seed=3)
    assert sorted(a[0] + a[1] + a[2]) == list(range(20)) and [len(x) for x in a] == [12, 4, 4]


def test_graph_task_fp64_and_resume(tmp_path):
    cfg = config("graph", n=12, epochs=1, precision="fp64", Checkpoint={"every": 1})
    first = run_training(cfg, tmp_path)
    assert first["epochs_run"] == 1
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = 2
    second = run_training(cfg, tmp_path, resume=True)
    assert [h["epoch"] for h in second["history"]] == [0, 1]
    assert second["history"][0] == first["history"][0]
    model = load_artifact(tmp_path / "model.hydra")
    assert model.dtype == torch.float64
    assert model.manifest["extra"]["best_epoch"] == second["best_epoch"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["NeuralNetwork"]["Architecture"]["precision"] == "fp64"
    assert set(second["test"]["mae"]) == {"energy_per_atom", "au_fraction"}
    assert (tmp_path / "parity_au_fraction.png").stat().st_size > 1000


def test_pna_degree_histogram_filled_from_the_training_split(tmp_path):
    """A PNA run without ``pna_deg`` gets the training split's in-degree histogram, and its artifact
    rebuilds that model; a configured ``pna_deg`` is kept; other encoders are left alone."""
    from train_helpers import samples

    from hydragnn.models.encoders.graph_statistics import degree_histogram
    from hydragnn.train.config import load_config
    from hydragnn.train.pipeline import fill_data_statistics

    data = samples("graph", n=6)
    hist = degree_histogram(data)
    degrees = torch.cat([torch.bincount(d.edge_index[1], minlength=d.num_nodes) for d in data])
    assert hist == torch.bincount(degrees).tolist() and sum(hist) == sum(d.num_nodes for d in data)

    cfg = config("graph", n=12, epochs=1)
    cfg["NeuralNetwork"]["Architecture"]["mpnn_type"] = "PNA"
    run_training(cfg, tmp_path)
    model = load_artifact(tmp_path / "model.hydra")
    run = load_config(cfg)
    train_idx, _, _ = split_indices(12, run.dataset.split, run.dataset.seed)
    prepared = [samples("graph", n=12)[i] for i in train_idx]
    assert list(model.config.encoder.pna_deg) == degree_histogram(prepared)

    given = load_config(cfg).model_config
    fixed = fill_data_statistics(type(given).from_dict({**given.raw, "pna_deg": [0, 3, 5]}), prepared)
    assert list(fixed.encoder.pna_deg) == [0, 3, 5]
    schnet = load_config(config("graph")).model_config
    assert fill_data_statistics(schnet, prepared) is schnet


def test_mace_avg_num_neighbors_is_the_training_mean_in_degree():
    """MACE without ``avg_num_neighbors`` gets the training split's edges per atom (mace-torch's
    statistic); a configured value is kept; a model built outside the trainer uses the default."""
    from train_helpers import samples

    from hydragnn.models.encoder_configs.geometric import MACE_DEFAULT_AVG_NUM_NEIGHBORS
    from hydragnn.models.encoders.mace import MACEEncoder
    from hydragnn.train.config import load_config
    from hydragnn.train.pipeline import fill_data_statistics

    prepared = samples("mlip", n=6)
    edges = sum(d.edge_index.shape[1] for d in prepared)
    atoms = sum(d.num_nodes for d in prepared)
    cfg = config("mlip")
    cfg["NeuralNetwork"]["Architecture"].update(mpnn_type="MACE", max_ell=1, correlation=2)
    given = load_config(cfg).model_config
    assert given.encoder.avg_num_neighbors is None
    filled = fill_data_statistics(given, prepared)
    assert filled.encoder.avg_num_neighbors == pytest.approx(edges / atoms, rel=1e-6) and edges / atoms != 10.0
    fixed = type(given).from_dict({**given.raw, "avg_num_neighbors": 7.5})
    assert fill_data_statistics(fixed, prepared).encoder.avg_num_neighbors == 7.5
    assert MACEEncoder.data_statistics(given.encoder, []) == {}
    from hydragnn.models import build_model

    run = load_config(cfg)
    for model_config, expected in ((given, MACE_DEFAULT_AVG_NUM_NEIGHBORS), (filled, edges / atoms)):
        encoder = build_model(model_config, run.schema).encoder
        assert encoder.interactions[0].inv_avg == pytest.approx(1.0 / expected, rel=1e-6)


@pytest.mark.parametrize(
    "mpnn_type, arch, unset",
    [("EGNN", {}, None), ("PAINN", {"avg_num_neighbors": "auto"}, "auto")],
)
def test_egnn_and_painn_avg_num_neighbors_from_the_training_split(mpnn_type, arch, unset):
    """EGNN (by default) and PAINN (``"auto"``) divide their sums by the training split's mean
    in-degree, stored in the config the artifact keeps; PAINN by default sums plainly."""
    from train_helpers import samples

    from hydragnn.models import build_model
    from hydragnn.models.encoder_configs.geometric import EGNN_DEFAULT_AVG_NUM_NEIGHBORS
    from hydragnn.train.config import load_config
    from hydragnn.train.pipeline import fill_data_statistics

    prepared = samples("mlip", n=6)
    mean = sum(d.edge_index.shape[1] for d in prepared) / sum(d.num_nodes for d in prepared)
    cfg = config("mlip")
    cfg["NeuralNetwork"]["Architecture"].update(mpnn_type=mpnn_type, **arch)
    run = load_config(cfg)
    given = run.model_config
    assert given.encoder.avg_num_neighbors == unset
    filled = fill_data_statistics(given, prepared)
    assert filled.encoder.avg_num_neighbors == pytest.approx(mean, rel=1e-6) and mean != 10.0
    assert type(given).from_dict(filled.raw).encoder.avg_num_neighbors == filled.encoder.avg_num_neighbors
    layer = build_model(filled, run.schema).encoder.layers[0]
    unfilled = build_model(given, run.schema).encoder.layers[0]
    assert layer.inv_norm == pytest.approx(1.0 / mean, rel=1e-6)
    if mpnn_type == "EGNN":
        assert unfilled.inv_norm == 1.0 / EGNN_DEFAULT_AVG_NUM_NEIGHBORS
    else:
        assert unfilled.inv_norm is None
        plain_cfg = config("mlip")
        plain_cfg["NeuralNetwork"]["Architecture"].update(mpnn_type="PAINN")
        plain = load_config(plain_cfg).model_config
        assert plain.encoder.avg_num_neighbors is None
        assert fill_data_statistics(plain, prepared) is plain


@pytest.mark.parametrize(
    "fraction, message",
    [(None, "more than max_skipped_fraction=0.1"), (1.0, "no epoch of 2 reached a finite validation loss")],
)
def test_a_diverged_run_fails_and_writes_no_artifact(tmp_path, fraction, message):
    """nan_policy 'skip' with a learning rate that blows the weights up: never exit 0 with them."""
    training = {"nan_policy": "skip", "Optimizer": {"type": "SGD", "learning_rate": 1e30}}
    if fraction is not None:
        training["max_skipped_fraction"] = fraction
    cfg = config("graph", n=12, epochs=2, **training)
    with pytest.raises(TrainingAborted, match=message):
        run_training(cfg, tmp_path)
    assert not (tmp_path / "model.hydra").exists() and not (tmp_path / "metrics.json").exists()


def test_disk_full_at_the_final_files_is_a_clean_error_and_resume_finishes(tmp_path, monkeypatch):
    import errno

    import hydragnn.train.pipeline as pipeline
    from hydragnn.train import TrainError

    real = pipeline.atomic_write

    def full(path, content, **kw):
        if str(path).endswith("metrics.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, content, **kw)

    cfg = config("graph", n=12, epochs=1, Checkpoint={"every": 1})
    monkeypatch.setattr(pipeline, "atomic_write", full)
    with pytest.raises(TrainError, match=r"metrics.json: cannot be written .*No space left.*--resume"):
        run_training(cfg, tmp_path)
    assert not (tmp_path / "metrics.json").exists()
    monkeypatch.setattr(pipeline, "atomic_write", real)
    again = run_training(cfg, tmp_path, resume=True)
    assert (tmp_path / "metrics.json").exists() and again["epochs_run"] == 1
