"""A head layer whose ReLU units all died is reported while training, naming the layer; healthy
heads and smooth activations say nothing."""

from __future__ import annotations

import torch
from train_helpers import GRAPH_ARCH, GRAPH_VARIABLES, config, samples

from hydragnn.data import Schema
from hydragnn.models import build_model
from hydragnn.train import create_dataloaders, train_validate_test
from hydragnn.train.health import head_activations


def _train(tmp_path, activation: str, kill: bool, capsys) -> tuple[dict, str]:
    torch.manual_seed(0)
    model = build_model({**GRAPH_ARCH, "activation": activation}, Schema.from_dict(GRAPH_VARIABLES))
    if kill:  # every unit of the first shared layer negative for every input: dead from the start
        first = model.graph_heads.shared[0]
        with torch.no_grad():
            first.weight.zero_()
            first.bias.fill_(-1.0)
    data = samples("graph", 16)
    train, val, _ = create_dataloaders(data[:8], data[8:12], None, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config("graph", epochs=3)["NeuralNetwork"]
    summary = train_validate_test(model, optimizer, train, val, None, None, None, nn_config, "t", 1, run_dir=tmp_path)
    return summary, capsys.readouterr().out


def test_a_dead_shared_layer_is_reported_once_while_training(tmp_path, capsys):
    summary, out = _train(tmp_path, "relu", kill=True, capsys=capsys)
    assert summary["dead_head_layers"] == ["graph_heads.shared.1"]
    lines = [line for line in out.splitlines() if "were zero on every validation sample" in line]
    assert len(lines) == 1 and "epoch 0: all " in lines[0] and "graph_heads.shared.1 (ReLU)" in lines[0]
    assert 'Architecture.activation: "silu"' in lines[0]
    assert summary["history"][0]["dead_head_layers"] == ["graph_heads.shared.1"]


def test_healthy_and_smooth_heads_say_nothing(tmp_path, capsys):
    for activation, kill in (("relu", False), ("silu", True)):
        summary, out = _train(tmp_path / f"{activation}{kill}", activation, kill, capsys)
        assert summary["dead_head_layers"] == [] and "were zero on every validation sample" not in out


def test_only_the_heads_activations_are_watched():
    model = build_model({**GRAPH_ARCH, "activation": "relu"}, Schema.from_dict(GRAPH_VARIABLES))
    watched = head_activations(model)
    assert watched and all(path.startswith("graph_heads.") for path in watched)
