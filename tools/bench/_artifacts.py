"""Shared by the benchmark scripts (``nox -s bench`` skips ``_*.py``): the untrained potentials they time."""

from __future__ import annotations

import copy
from pathlib import Path


def schnet_artifact(folder: Path, *, layers: int, radius: float) -> Path:
    """An untrained SchNet MLIP (hidden 32, ``layers`` x ``radius`` Å, energy / forces / stress of
    the Cu-Au schema, seed 0) saved as ``folder/bench.hydra``: timing only."""
    import torch

    from hydragnn.data import Schema
    from hydragnn.data.emt import CUAU_VARIABLES
    from hydragnn.models import build_model, save_artifact

    variables = copy.deepcopy(CUAU_VARIABLES)
    variables["outputs"].append({"name": "stress", "level": "graph", "dim": 6})
    arch = {
        "mpnn_type": "SchNet",
        "hidden_dim": 32,
        "num_conv_layers": layers,
        "radius": radius,
        "num_radial": 16,
        "enable_interatomic_potential": True,
        "output_heads": {"node": {"num_headlayers": 1}},
    }
    torch.manual_seed(0)
    model = build_model(arch, Schema.from_dict(variables)).eval()
    return save_artifact(model, folder / "bench.hydra", species=[29, 79])
