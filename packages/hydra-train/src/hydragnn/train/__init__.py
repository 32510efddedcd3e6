"""hydra-train: the HydraGNN training layer.

The seed API: ``create_dataloaders`` (from hydra-data), ``train_validate_test``, ``test``,
``save_model``, ``load_existing_model``; the JSON config as typed objects (``load_config`` ->
:class:`RunConfig`); ``hydragnn-train config.json`` runs the whole pipeline
(:func:`hydragnn.train.pipeline.run_training`).
"""

from hydragnn.data import create_dataloaders

from .__about__ import __version__
from .checkpoint import load_existing_model, save_model
from .config import RunConfig, TrainingConfig, load_config
from .errors import CheckpointError, ConfigError, TrainError, TrainingAborted
from .evaluate import test
from .loop import train_validate_test

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
