"""``Dataset.compositional_stratified_splitting``: every composition keeps its share in each part."""

from __future__ import annotations

import collections
import json

import pytest
import torch
from torch_geometric.data import Data
from train_helpers import config

from hydragnn.data import DataError
from hydragnn.train import ConfigError, load_config
from hydragnn.train.data import load_run_data
from hydragnn.train.split import composition, split_indices


def _shares(parts, categories):
    return [collections.Counter(categories[i] for i in part) for part in parts]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_each_category_contributes_in_proportion_and_the_sizes_stay(seed):
    categories = ["a"] * 50 + ["b"] * 30 + ["c"] * 15 + ["d"] * 4 + ["e"]
    plain = split_indices(len(categories), (0.7, 0.2, 0.1), seed)
    parts = split_indices(len(categories), (0.7, 0.2, 0.1), seed, categories)
    assert [len(p) for p in parts] == [len(p) for p in plain] == [70, 20, 10]
    assert sorted(i for p in parts for i in p) == list(range(len(categories)))
    sizes = collections.Counter(categories)
    for share, fraction in zip(_shares(parts, categories), (0.7, 0.2, 0.1), strict=True):
        for category, size in sizes.items():
            assert abs(share[category] - fraction * size) < 1, (category, share, fraction)
    assert parts == split_indices(len(categories), (0.7, 0.2, 0.1), seed, categories)  # deterministic
    assert parts != split_indices(len(categories), (0.7, 0.2, 0.1), seed + 100, categories)


def test_a_plain_split_of_the_same_data_misses_rare_compositions():
    """Why it exists: 5 % of one composition; a plain 80/10/10 split of 100 samples often leaves
    the test part without it, the stratified one never does."""
    categories = ["bulk"] * 95 + ["surface"] * 5
    missing = sum(
        "surface" not in {categories[i] for i in split_indices(100, (0.8, 0.1, 0.1), s)[2]} for s in range(50)
    )
    assert missing > 10
    for s in range(50):
        test = split_indices(100, (0.8, 0.1, 0.1), s, categories)[2]
        assert sum(categories[i] == "surface" for i in test) in (0, 1)
        assert len(test) == 10
    counts = [
        sum(categories[i] == "surface" for i in split_indices(100, (0.7, 0.1, 0.2), s, categories)[2]) for s in range(5)
    ]
    assert counts == [1] * 5  # 0.2 x 5 = 1 seat: always there


def test_composition_reads_atomic_numbers_and_names_a_sample_without():
    sample = Data(atomic_number=torch.tensor([[29], [79], [29], [29]]))
    assert composition(sample, 0) == ((29, 3), (79, 1))
    with pytest.raises(DataError, match="sample 3 has no atomic_number"):
        composition(Data(x=torch.zeros(2, 1)), 3)


def test_the_config_key_splits_the_emt_set_by_composition():
    cfg = config("mlip", n=40)
    cfg["Dataset"]["compositional_stratified_splitting"] = True
    cfg["Dataset"]["split"] = [0.5, 0.25, 0.25]
    run = load_config(cfg)
    assert run.dataset.compositional_stratified_splitting
    assert run.to_dict()["Dataset"]["compositional_stratified_splitting"] is True
    assert "compositional_stratified_splitting" not in load_config(config("mlip", n=40)).to_dict()["Dataset"]
    data = load_run_data(run)
    parts = [data.train, data.val, data.test]
    categories = {}
    for part_id, part in enumerate(parts):
        for i, sample in enumerate(part):
            categories[(part_id, i)] = composition(sample, i)
    sizes = collections.Counter(categories.values())
    for part_id, fraction in enumerate((0.5, 0.25, 0.25)):
        share = collections.Counter(c for (p, _), c in categories.items() if p == part_id)
        for category, size in sizes.items():
            assert abs(share[category] - fraction * size) < 1
    with pytest.raises(ConfigError, match="compositional_stratified_splitting"):
        load_config({**cfg, "Dataset": {**cfg["Dataset"], "compositional_stratified_splitting": "yes"}})


@pytest.mark.parametrize("method", ["minmax", "standard"])
def test_normalize_outputs_fills_the_scaling_from_the_training_split(tmp_path, method):
    """``Training.normalize_outputs``: the artifact's ``output_scaling`` is the training split's
    statistic per head, its predictions are in the data's units, and a resume keeps it."""
    from hydragnn.models import load_artifact
    from hydragnn.models.loss import targets
    from hydragnn.train.pipeline import run_training

    cfg = config("graph", n=12, epochs=2, normalize_outputs=method)
    run = load_config(cfg)
    data = load_run_data(run)
    rows = {
        name: torch.cat([targets(s, run.schema)[name] for s in data.train])
        for name in ("energy_per_atom", "au_fraction")
    }
    metrics = run_training(cfg, tmp_path / "run")
    model = load_artifact(tmp_path / "run" / "model.hydra")
    scaling = {name: (shift, scale) for name, shift, scale in model.config.output_scaling}
    for name, values in rows.items():
        values = values.double()
        if method == "minmax":
            want = (values.min(0).values, values.max(0).values - values.min(0).values)
        else:
            want = (values.mean(0), values.std(0, unbiased=False))
        torch.testing.assert_close(torch.tensor(scaling[name][0], dtype=torch.float64), want[0])
        torch.testing.assert_close(torch.tensor(scaling[name][1], dtype=torch.float64), want[1])
    assert (
        json.loads((tmp_path / "run" / "config.json").read_text())["NeuralNetwork"]["Training"]["normalize_outputs"]
        == method
    )
    assert metrics["test"]["mae"]["energy_per_atom"]["mae"] is not None
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = 3
    run_training(cfg, tmp_path / "run", resume=True)
    resumed = load_artifact(tmp_path / "run" / "model.hydra")
    assert resumed.config.output_scaling == model.config.output_scaling
