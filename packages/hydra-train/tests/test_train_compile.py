"""``Training.compile``: one compiled graph for training batches of any size, one for evaluation,
the same training as eager; refused where a compiled backward cannot serve."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from train_helpers import build, config, samples

from hydragnn.train import ConfigError, create_dataloaders, train_validate_test
from hydragnn.train.strategies.ddp import DDPStrategy


def _run(model, compile_: bool, tmp_path, kind: str = "graph") -> dict:
    data = samples(kind, 16)
    train, val, _ = create_dataloaders(data[:8], data[8:12], data[12:], 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    nn_config = config(kind, epochs=2, compile=compile_)["NeuralNetwork"]
    return train_validate_test(model, optimizer, train, val, None, None, None, nn_config, "c", 0, run_dir=tmp_path)


def test_compiled_training_compiles_once_per_mode_and_trains_as_eager(tmp_path):
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = build(), build()
    edges = {int(d.edge_index.shape[1]) for d in samples("graph", 16)}
    assert len(edges) > 4  # batches differ in edge count: one graph must serve them all
    _run(eager, False, tmp_path / "eager")
    assert counters["stats"]["unique_graphs"] == 0
    summary = _run(compiled, True, tmp_path / "compiled")
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # training + no_grad evaluation
    assert summary["epochs_run"] == 2
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)


def test_compile_is_refused_for_forces_by_autograd_and_distributed_strategies(tmp_path):
    with pytest.raises(ConfigError, match=r"Training\.compile: not for interatomic potentials"):
        _run(build("mlip"), True, tmp_path, kind="mlip")

    ddp = DDPStrategy.__new__(DDPStrategy)  # the class's rule: no process group needed to refuse
    with pytest.raises(ConfigError, match=r"Training\.compile: single-process training only \(strategy 'ddp'\)"):
        ddp.compile()
