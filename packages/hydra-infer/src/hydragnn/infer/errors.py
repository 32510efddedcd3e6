"""The hydra-infer exception and warning types."""

from __future__ import annotations


class InferenceError(ValueError):
    """Invalid calculator input or an unusable model; the message names the argument, what was
    expected and what was found."""


class HydraInferWarning(UserWarning):
    """A hydra-infer fallback or ignored option (issued once per calculator and reason)."""


class GraphFallbackWarning(HydraInferWarning, RuntimeWarning):
    """A CUDA-graph capture, check or replay failed: that layout went back to the regular path
    (issued once per calculator)."""
