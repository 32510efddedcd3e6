"""Shared tiny data and configs of the hydra-train loop / config / CLI tests."""

from __future__ import annotations

import copy
import functools

import torch

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES

GRAPH_VARIABLES = {
    "inputs": [
        {"name": "atomic_number", "level": "node", "dim": 1},
        {"name": "pos", "level": "node", "dim": 3, "role": "position"},
    ],
    "outputs": [
        {"name": "energy_per_atom", "level": "graph", "dim": 1},
        {"name": "au_fraction", "level": "graph", "dim": 1},
    ],
}

GRAPH_ARCH = {
    "mpnn_type": "SchNet",
    "hidden_dim": 8,
    "num_conv_layers": 2,
    "radius": 4.0,
    "num_radial": 8,
    "output_heads": {"graph": {"num_sharedlayers": 1, "num_headlayers": 1}},
    "task_weights": [100.0, 1.0],
}

MLIP_ARCH = {
    "mpnn_type": "SchNet",
    "hidden_dim": 8,
    "num_conv_layers": 2,
    "radius": 4.0,
    "num_radial": 8,
    "enable_interatomic_potential": True,
    "reference_energies": {"29": 0.0568, "79": 0.0587},
    "output_heads": {"node": {"num_headlayers": 1}},
    "task_weights": [3.0, 1.0, 1.0],
}


@functools.lru_cache(maxsize=4)
def _raw(n: int, seed: int):
    from hydragnn.train.data import cuau_samples

    return cuau_samples(n, seed)


def samples(kind: str = "graph", n: int = 16, seed: int = 0) -> list:
    """Prepared CuAu samples with edges (fresh copies: tests may edit them)."""
    from hydragnn.train.data import prepare_samples

    variables = GRAPH_VARIABLES if kind == "graph" else CUAU_VARIABLES
    arch = GRAPH_ARCH if kind == "graph" else MLIP_ARCH
    raw = [s.clone() for s in _raw(n, seed)]
    return prepare_samples(raw, Schema.from_dict(variables), arch["radius"])


def config(kind: str = "graph", n: int = 16, epochs: int = 2, **training) -> dict:
    """A complete tiny run config."""
    return {
        "Verbosity": {"level": 0},
        "Dataset": {
            "name": f"tiny_{kind}",
            "generator": {"name": "cuau", "n_structures": n, "seed": 0},
            "split": [0.5, 0.25, 0.25],
            "seed": 0,
        },
        "Variables": copy.deepcopy(GRAPH_VARIABLES if kind == "graph" else CUAU_VARIABLES),
        "NeuralNetwork": {
            "Architecture": copy.deepcopy(GRAPH_ARCH if kind == "graph" else MLIP_ARCH),
            "Training": {
                "num_epoch": epochs,
                "batch_size": 4,
                "Optimizer": {"type": "Adam", "learning_rate": 0.01},
                **training,
            },
        },
    }


def build(kind: str = "graph", seed: int = 0):
    from hydragnn.models import build_model

    variables = GRAPH_VARIABLES if kind == "graph" else CUAU_VARIABLES
    arch = GRAPH_ARCH if kind == "graph" else MLIP_ARCH
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(arch, Schema.from_dict(variables))


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# An MLIP trained from extxyz files by the file / fine-tuning / source tests.
FILE_ARCH = {
    "mpnn_type": "SchNet",
    "hidden_dim": 8,
    "num_conv_layers": 1,
    "radius": 4.0,
    "num_radial": 8,
    "enable_interatomic_potential": True,
}
REF_KEYS = {"energy_key": "REF_energy", "forces_key": "REF_forces", "stress_key": None}
