"""hydra-train: the HydraGNN training layer.

The seed API: ``create_dataloaders`` (from hydra-data), ``train_validate_test``, ``test``,
``save_model``, ``load_existing_model``; the JSON config as typed objects (``load_config`` ->
:class:`RunConfig`); ``hydragnn-train config.json`` runs the whole pipeline
(:func:`hydragnn.train.pipeline.run_training`).

Names are imported on first use (PEP 562), so ``import hydragnn.train.cli`` (and
``hydragnn-train --help``) does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydragnn.data.lazy import lazy_names

from .__about__ import __version__
from .errors import CheckpointError, ConfigError, TrainError, TrainingAborted

if TYPE_CHECKING:  # the lazy names, for type checkers
    from hydragnn.data.loaders import create_dataloaders

    from .callbacks import Callback, register_callback
    from .checkpoint import load_existing_model, save_model
    from .config import RunConfig, TrainingConfig, load_config
    from .evaluate import test
    from .seed_api import train_validate_test

_LAZY = {
    "Callback": ".callbacks",
    "register_callback": ".callbacks",
    "create_dataloaders": "hydragnn.data",
    "load_existing_model": ".checkpoint",
    "save_model": ".checkpoint",
    "RunConfig": ".config",
    "TrainingConfig": ".config",
    "load_config": ".config",
    "test": ".evaluate",
    "train_validate_test": ".seed_api",
}

__all__ = [
    "__version__",
    "Callback",
    "CheckpointError",
    "ConfigError",
    "RunConfig",
    "TrainError",
    "TrainingAborted",
    "TrainingConfig",
    "create_dataloaders",
    "load_config",
    "load_existing_model",
    "register_callback",
    "save_model",
    "test",
    "train_validate_test",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
