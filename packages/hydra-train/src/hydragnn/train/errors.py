"""The exception hierarchy of hydra-train."""

from __future__ import annotations


class TrainError(Exception):
    """Base class of every error raised on purpose by hydra-train."""


class ConfigError(TrainError, ValueError):
    """The JSON config is invalid; the message names the JSON path and what was expected."""


class TrainingAborted(TrainError, RuntimeError):
    """Training stopped on purpose (a NaN loss, a dead peer rank, ...); the message says where."""


class CheckpointError(TrainError, OSError):
    """A checkpoint is missing, corrupted or does not match the model."""
