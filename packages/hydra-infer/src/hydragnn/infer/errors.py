"""The hydra-infer exception and warning types."""

from __future__ import annotations


class InferenceError(ValueError):
    """Invalid calculator input or an unusable model; the message names the argument, what was
    expected and what was found."""


class HydraInferWarning(UserWarning):
    """A hydra-infer fallback or ignored option (issued once per calculator and reason)."""
