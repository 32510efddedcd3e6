"""CUDA-graph engines of hydra-infer: static-buffer dense / sparse engines, capture backends, the policy cache.

See :mod:`.engine` for the policy, :mod:`.backends` for real capture vs the CPU replay backend.
"""

from __future__ import annotations

from ..model_info import model_fingerprint
from .backends import CudaGraphBackend, ReplayBackend, make_backend
from .engine import BUDGET_FRACTION, MAX_ENGINES, GraphEngineCache

__all__ = [
    "BUDGET_FRACTION",
    "MAX_ENGINES",
    "CudaGraphBackend",
    "GraphEngineCache",
    "ReplayBackend",
    "make_backend",
    "model_fingerprint",
]
