"""A head layer whose ReLU units all died, and an output that is a constant, are reported while
training, naming the layer or output; healthy heads and smooth activations say nothing."""

from __future__ import annotations

import pytest
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
    # what the dead layer feeds is a constant: both outputs are named, once
    outputs = ["graph_heads.energy_per_atom", "graph_heads.au_fraction"]
    assert sorted(summary["constant_outputs"]) == sorted(outputs)
    assert sorted(summary["history"][0]["constant_outputs"]) == sorted(outputs)
    constant = [line for line in out.splitlines() if "for all 4 validation rows" in line]
    assert len(constant) == 2 and all("the model predicts a constant" in line for line in constant)


def test_healthy_and_smooth_heads_say_nothing(tmp_path, capsys):
    for activation, kill in (("relu", False), ("silu", True)):
        summary, out = _train(tmp_path / f"{activation}{kill}", activation, kill, capsys)
        assert summary["dead_head_layers"] == [] and "were zero on every validation sample" not in out
        assert summary["constant_outputs"] == [] and "predicts a constant" not in out


def test_only_the_heads_activations_are_watched():
    model = build_model({**GRAPH_ARCH, "activation": "relu"}, Schema.from_dict(GRAPH_VARIABLES))
    watched = head_activations(model)
    assert watched and all(path.startswith("graph_heads.") for path in watched)


def test_a_layer_that_revives_is_reported_again_and_leaves_the_summary():
    from types import SimpleNamespace

    from hydragnn.data.collate import collate_graphs
    from hydragnn.train.health import DeadHeadUnits

    torch.manual_seed(0)
    model = build_model({**GRAPH_ARCH, "activation": "relu"}, Schema.from_dict(GRAPH_VARIABLES)).eval()
    batch = collate_graphs(samples("graph", 6))
    first = model.graph_heads.shared[0]
    saved = {k: v.clone() for k, v in first.state_dict().items()}
    lines: list[str] = []
    loop = SimpleNamespace(log=lines.append, module=model)
    watch = DeadHeadUnits()
    with torch.no_grad():
        first.weight.zero_()
        first.bias.fill_(-1.0)
        for epoch in range(2):  # dead for two epochs: reported once
            with watch.evaluating(loop):
                model(batch)
            watch.on_epoch_end(loop, record := {"epoch": epoch})
        assert record["dead_head_layers"] == ["graph_heads.shared.1"]
        first.load_state_dict(saved)
        with watch.evaluating(loop):
            model(batch)
        watch.on_epoch_end(loop, record := {"epoch": 2})
    assert "dead_head_layers" not in record and watch.summary() == {"dead_head_layers": [], "constant_outputs": []}
    assert sum("were zero on every validation sample" in line for line in lines) == 1
    assert "epoch 2: graph_heads.shared.1 is alive again" in "\n".join(lines)
    assert sum("varies again" in line for line in lines) == 2  # both outputs it fed


def test_a_drifting_head_input_scale_is_reported_at_each_thousandfold_and_survives_a_resume(tmp_path):
    """The graph heads standardise their input, so the loss cannot hold the encoder's scale back
    (PNAEq drifted to 1e15 under upstream's ci.json): each thousandfold growth over the first
    epoch's scale is reported; the reference survives a checkpoint."""
    from types import SimpleNamespace

    from hydragnn.train.health import HeadInputScale

    torch.manual_seed(0)
    model = build_model({**GRAPH_ARCH, "activation": "relu"}, Schema.from_dict(GRAPH_VARIABLES)).train()
    norm = model.graph_heads.input_norm
    lines: list[str] = []
    loop = SimpleNamespace(log=lines.append, module=model)
    watch = HeadInputScale()
    watch.on_epoch_end(loop, {"epoch": 0})  # no statistics yet: nothing to compare
    assert watch.summary() == {"head_input_growth": 1.0}
    rows = torch.randn(8, norm.running_mean.shape[0])
    for epoch, scale in enumerate((1.0, 50.0, 2e3, 1e5, 3e6), start=1):
        norm.running_std = torch.ones_like(norm.running_std)  # momentum aside: set by these rows
        norm.num_batches_tracked.zero_()
        norm.update(rows * scale)
        watch.on_epoch_end(loop, {"epoch": epoch})
        if epoch == 3:
            path = tmp_path / "state.pt"
            torch.save(watch.state_dict(), path)
            watch = HeadInputScale()
            watch.load_state_dict(torch.load(path, weights_only=True))
    assert [line.split(":")[0] for line in lines] == ["warning", "warning"]
    assert "epoch 3: the scale of graph_heads.input_norm's input" in lines[0] and "2.0e+03 times" in lines[0]
    assert "epoch 5:" in lines[1] and "3.0e+06 times" in lines[1]  # 1e5 is not another 1000x over 2e3
    assert 'output_heads.graph.input_norm to "none"' in lines[0]
    assert watch.summary()["head_input_growth"] == pytest.approx(3e6, rel=1e-4)
