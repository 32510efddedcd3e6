"""CUDA-graph engines of hydra-infer: static-buffer dense / sparse engines, capture backends, the policy cache.

See :mod:`.engine` for the policy, :mod:`.backends` for real capture vs the CPU replay backend.
"""

from __future__ import annotations

from .backends import CudaGraphBackend, ReplayBackend, make_backend
from .engine import BUDGET_FRACTION, MAX_ENGINES, GraphEngineCache, model_fingerprint

__all__ = [
    "BUDGET_FRACTION",
    "MAX_ENGINES",
    "CudaGraphBackend",
    "GraphEngineCache",
    "ReplayBackend",
    "make_backend",
    "model_fingerprint",
]
