"""Test helpers for hydra-infer: tiny SchNet MLIPs and Cu-Au clusters."""

from __future__ import annotations

import copy

import numpy as np
import torch

from hydragnn.data import Schema
from hydragnn.data.emt import CUAU_VARIABLES
from hydragnn.models import build_model

CUTOFF = 4.0
STRESS_VARIABLES = copy.deepcopy(CUAU_VARIABLES)
STRESS_VARIABLES["outputs"].append({"name": "stress", "level": "graph", "dim": 6})


def tiny_arch(**overrides) -> dict:
    arch = {
        "mpnn_type": "SchNet",
        "hidden_dim": 8,
        "num_conv_layers": 2,
        "radius": CUTOFF,
        "num_radial": 8,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
        "precision": "fp64",
    }
    arch.update(overrides)
    return arch


def tiny_model(seed: int = 0, variables=STRESS_VARIABLES, **overrides):
    torch.manual_seed(seed)
    model = build_model(tiny_arch(**overrides), Schema.from_dict(variables)).eval()
    return model.requires_grad_(False)  # served models are frozen (CUDA-graph replay refuses trainable ones)


def cluster(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random non-periodic Cu-Au cluster of ``n`` atoms at fcc-like density."""
    rng = np.random.default_rng(seed)
    side = (n * 12.0) ** (1 / 3)
    pos = rng.uniform(0.0, side, size=(n, 3))
    numbers = rng.choice([29, 79], size=n)
    return pos, numbers
