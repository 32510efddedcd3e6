"""hydra-train: the HydraGNN training layer.

The seed API: ``create_dataloaders`` (from hydra-data), ``train_validate_test``, ``test``,
``save_model``, ``load_existing_model``; the JSON config as typed objects (``load_config`` ->
:class:`RunConfig`); ``hydragnn-train config.json`` runs the whole pipeline
(:func:`hydragnn.train.pipeline.run_training`).

Names are imported on first use (PEP 562), so ``import hydragnn.train.cli`` (and
``hydragnn-train --help``) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .__about__ import __version__
from .errors import CheckpointError, ConfigError, TrainError, TrainingAborted

_LAZY = {
    "create_dataloaders": "hydragnn.data",
    "load_existing_model": ".checkpoint",
    "save_model": ".checkpoint",
    "RunConfig": ".config",
    "TrainingConfig": ".config",
    "load_config": ".config",
    "test": ".evaluate",
    "train_validate_test": ".loop",
}

__all__ = [
    "__version__",
    "CheckpointError",
    "ConfigError",
    "RunConfig",
    "TrainError",
    "TrainingAborted",
    "TrainingConfig",
    "create_dataloaders",
    "load_config",
    "load_existing_model",
    "save_model",
    "test",
    "train_validate_test",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hydragnn.train' has no attribute {name!r}")
    importlib.import_module("hydragnn.data")  # before torch: it sets OpenMP's wait policy (hydragnn.data.threads)
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
