"""Upstream HydraGNN's ``tests/inputs/ci.json`` settings learn here, activation as written (ReLU).

The data imitate upstream's unit-test graphs (its ``deterministic_graph_data``, regenerated here,
not copied): 2-8 atoms on the sites of a BCC cell, one node feature ``x`` in [0, 1), the graph
target ``sum(x + x^2 + x^3)`` min-max normalised over the data set. The settings are ci.json's:
hidden 8, 2 conv layers, radius 2, graph heads with 2 shared layers of width 4 and 2 head layers
of 10, ReLU, MSE, AdamW lr 0.02, batch 32, ReduceLROnPlateau (as upstream's test workflow).

Each encoder upstream's ``tests/test_graphs.py`` trains must pass upstream's own threshold there
(test MSE below its "RMSE" bound, sample MAE below its MAE bound) and, since predicting the
training mean already passes those bounds on this target, also reach half the mean predictor's
test MSE; when training ends no head layer may be dead and no output a constant
(``DeadHeadUnits``).
Before the graph heads standardised their input, PAINN and EGNN stayed at the mean predictor
here (docs/notes/upstream_configs_dead_heads.md).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import Schema, add_edges, prepare
from hydragnn.models import build_model
from hydragnn.train import create_dataloaders, train_validate_test

SCHEMA = {
    "inputs": [
        {"name": "x_feat", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [{"name": "sum_x_x2_x3", "level": "graph", "dim": 1}],
}
CI_ARCH = {
    "hidden_dim": 8,
    "num_conv_layers": 2,
    "radius": 2.0,
    "num_radial": 6,
    "activation": "relu",
    "graph_pooling": "mean",
    "output_heads": {
        "graph": {"num_sharedlayers": 2, "dim_sharedlayers": 4, "num_headlayers": 2, "dim_headlayers": [10, 10]}
    },
    "task_weights": [1.0],
}
# upstream tests/test_graphs.py: encoder -> (bound on the test MSE it calls RMSE, bound on the sample MAE)
UPSTREAM_THRESHOLDS = {
    "SAGE": (0.20, 0.20),
    "PNA": (0.20, 0.20),
    "PNAPlus": (0.20, 0.20),
    "MFC": (0.20, 0.30),
    "GIN": (0.25, 0.20),
    "GAT": (0.60, 0.70),
    "CGCNN": (0.50, 0.40),
    "SchNet": (0.20, 0.20),
    "DimeNet": (0.50, 0.50),
    "EGNN": (0.20, 0.20),
    "PNAEq": (0.60, 0.60),
    "PAINN": (0.60, 0.60),
    "MACE": (0.60, 0.70),
}
EPOCHS = 40


def _bcc_graphs(n: int, seed: int) -> list[Data]:
    """``n`` graphs of 2-8 atoms on the 16 sites of a 2x2x2 BCC block (lattice 1), target min-max normalised."""
    g = torch.Generator().manual_seed(seed)
    corners = torch.tensor(list(itertools.product(range(2), repeat=3)), dtype=torch.float32)
    sites = torch.cat([corners, corners + 0.5])
    raw = []
    for _ in range(n):
        k = int(torch.randint(2, 9, (1,), generator=g))
        pos = sites[torch.randperm(len(sites), generator=g)[:k]]
        x = torch.rand(k, 1, generator=g)
        raw.append((pos, x, float((x + x**2 + x**3).sum())))
    lo, hi = min(t for *_, t in raw), max(t for *_, t in raw)
    schema = Schema.from_dict(SCHEMA)
    return [
        add_edges(
            prepare(Data(x_feat=x, pos=pos, sum_x_x2_x3=torch.tensor([[(t - lo) / (hi - lo)]])), schema, index=i), 2.0
        )
        for i, (pos, x, t) in enumerate(raw)
    ]


@pytest.fixture(scope="module")
def splits():
    data = _bcc_graphs(300, seed=97)
    return data[:210], data[210:255], data[255:]


def _train_and_score(encoder: str, seed: int, splits, run_dir) -> tuple[dict, float, float, float]:
    """Train ``encoder`` with ci.json's settings from model seed ``seed``: (summary, test MSE,
    test MAE, the mean predictor's test MSE)."""
    train, val, test = splits
    torch.manual_seed(seed)
    model = build_model({**CI_ARCH, "mpnn_type": encoder}, Schema.from_dict(SCHEMA))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=5, min_lr=1e-5)
    loaders = create_dataloaders(train, val, test, 32)
    training = {"num_epoch": EPOCHS, "batch_size": 32, "loss_function_type": "mse", "Optimizer": {"type": "AdamW"}}
    summary = train_validate_test(
        model, optimizer, *loaders, None, scheduler, {"Training": training}, "ci", 0, run_dir=run_dir
    )
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(b)["sum_x_x2_x3"] for b in loaders[2]]).reshape(-1)
    target = torch.cat([d.sum_x_x2_x3.reshape(-1) for d in test])
    mse = float(((pred - target) ** 2).mean())
    mae = float((pred - target).abs().mean())
    mean_mse = float(((torch.cat([d.sum_x_x2_x3.reshape(-1) for d in train]).mean() - target) ** 2).mean())
    print(f"{encoder} seed {seed}: test MSE {mse:.5f} (mean predictor {mean_mse:.5f}), MAE {mae:.4f}, "
          f"head input growth {summary['head_input_growth']:.1e}")  # fmt: skip
    return summary, mse, mae, mean_mse


@pytest.mark.parametrize("encoder", sorted(UPSTREAM_THRESHOLDS))
def test_upstream_ci_config_learns(encoder, splits, tmp_path):
    """Model seeds 0 and 1: both pass upstream's bounds with no dead layer or constant output at
    the end, and at least one reaches half the mean predictor's MSE. Training at ci.json's
    learning rate is chaotic (a torch release changes which seed lands where): over seeds 0-3 and
    these 13 encoders, 3 of 52 runs missed half the mean predictor with the standardisation and
    26 of 52 without it (docs/notes/upstream_configs_dead_heads.md)."""
    mse_bound, mae_bound = UPSTREAM_THRESHOLDS[encoder]
    best = []
    for seed in (0, 1):
        summary, mse, mae, mean_mse = _train_and_score(encoder, seed, splits, tmp_path / str(seed))
        # a layer may die for a while and revive (reported both times); none is dead when training ends
        assert summary["dead_head_layers"] == [] and summary["constant_outputs"] == [], f"seed {seed}"
        assert mse < mse_bound and mae < mae_bound, f"seed {seed}: MSE {mse:.5f}, MAE {mae:.4f}"
        best.append(mse / mean_mse)
    assert min(best) < 0.5, f"{encoder}: test MSE / mean predictor's is {best} for seeds 0 and 1, neither below 0.5"
