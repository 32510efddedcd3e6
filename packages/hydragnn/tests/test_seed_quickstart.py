"""The seed's Quick Start, run as written.

The four snippets below are copied verbatim from the Quick Start of the upstream HydraGNN README
(the project's seed document, ``seeds/000_a5eedd63aafff387.txt``, lines 90-117). They run, in
order, in one namespace holding what the seed leaves to the caller: ``trainset`` / ``valset`` /
``testset`` (prepared EMT Cu-Au samples), ``model``, ``optimizer``, ``writer``, ``scheduler``,
``config``, ``log_name`` and ``verbosity``.
"""

from __future__ import annotations

import textwrap

import torch

SNIPPET_TRAIN = """
import hydragnn
from hydragnn.train import train_validate_test
from hydragnn.utils.model import load_existing_model, save_model

train_loader, val_loader, test_loader = hydragnn.preprocess.create_dataloaders(
    trainset, valset, testset, batch_size=32
)
train_validate_test(
    model, optimizer, train_loader, val_loader, test_loader,
    writer, scheduler, config["NeuralNetwork"], log_name, verbosity
)
"""

SNIPPET_SAVE = """
model_name = "model_checkpoint"
save_model(model, optimizer, model_name, path="./logs/")
"""

SNIPPET_LOAD = """
model_name = "model_checkpoint"
load_existing_model(model, model_name, path="./logs/")
"""

SNIPPET_PREDICT = """
import hydragnn
errors, task_errors, targets, predictions = hydragnn.train.test(
    test_loader, model, verbosity
)
"""

VARIABLES = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [
        {"name": "energy", "level": "graph", "dim": 1},
        {"name": "forces", "level": "node", "dim": 3},
    ],
}
ARCH = {
    "mpnn_type": "SchNet",
    "hidden_dim": 8,
    "num_conv_layers": 1,
    "radius": 4.0,
    "num_radial": 8,
    "enable_interatomic_potential": True,
    "output_heads": {"node": {"num_headlayers": 1}},
}


def _caller_namespace() -> dict:
    """What the seed leaves to the caller, built with the layers' public API."""
    from hydragnn.data import Schema, add_edges, generate_cuau, prepare
    from hydragnn.models import build_model

    schema = Schema.from_dict(VARIABLES)
    samples = [add_edges(prepare(s, schema, index=i), ARCH["radius"]) for i, s in enumerate(generate_cuau(8, seed=0))]
    torch.manual_seed(0)
    model = build_model(ARCH, schema)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return {
        "trainset": samples[:4],
        "valset": samples[4:6],
        "testset": samples[6:],
        "model": model,
        "optimizer": optimizer,
        "writer": None,
        "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=5),
        "config": {"NeuralNetwork": {"Architecture": ARCH, "Training": {"num_epoch": 2, "batch_size": 32}}},
        "log_name": "seed_quickstart",
        "verbosity": 0,
    }


def test_the_quick_start_runs_verbatim(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the snippets write ./logs/
    ns = _caller_namespace()
    model = ns["model"]

    exec(textwrap.dedent(SNIPPET_TRAIN), ns)
    assert [type(ns[k]).__name__ for k in ("train_loader", "val_loader", "test_loader")] == ["GraphLoader"] * 3

    exec(textwrap.dedent(SNIPPET_SAVE), ns)
    checkpoint = tmp_path / "logs" / "model_checkpoint" / "model_checkpoint.pt"
    assert checkpoint.is_file()
    trained = {k: v.clone() for k, v in model.state_dict().items()}

    with torch.no_grad():  # spoil the weights: loading must bring the saved ones back
        for p in model.parameters():
            p.add_(1.0)
    exec(textwrap.dedent(SNIPPET_LOAD), ns)
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())

    exec(textwrap.dedent(SNIPPET_PREDICT), ns)
    errors, task_errors, targets, predictions = (ns[k] for k in ("errors", "task_errors", "targets", "predictions"))
    assert isinstance(errors, float) and errors >= 0.0
    assert set(task_errors) == set(targets) == set(predictions) == {"energy", "forces"}
    n_atoms = sum(int(s.num_nodes) for s in ns["testset"])
    assert targets["energy"].shape == predictions["energy"].shape == (2, 1)
    assert targets["forces"].shape == predictions["forces"].shape == (n_atoms, 3)


def test_load_model_is_the_seeds_name_for_the_loader():
    # the seed: "The save_model and load_model functions store and retrieve model checkpoints";
    # upstream's loader is load_existing_model, and load_model is that function
    from hydragnn.train import load_existing_model as train_loader
    from hydragnn.train import save_model as train_save
    from hydragnn.utils.model import load_existing_model, load_model, save_model

    assert load_model is load_existing_model is train_loader and save_model is train_save
