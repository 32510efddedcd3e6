"""The exception hierarchy of hydra-models."""

from __future__ import annotations


class ModelError(Exception):
    """Base class of every error raised on purpose by hydra-models."""


class ModelConfigError(ModelError, ValueError):
    """An ``Architecture`` section is invalid: unknown key, wrong type, impossible combination.

    Messages name the JSON path (``NeuralNetwork.Architecture.<key>``) and what was expected.
    """


class ArtifactError(ModelError, OSError):
    """A model artifact is missing, corrupted, or written by a newer format."""
