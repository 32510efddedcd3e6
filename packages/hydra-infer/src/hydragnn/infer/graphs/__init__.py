"""CUDA-graph engines of hydra-infer: static-buffer dense / sparse / periodic engines, capture backends, the policy cache.

See :mod:`.engine` for the policy, :mod:`.backends` for real capture vs the CPU replay backend,
:mod:`.host` for what the engines need from their calculator.
"""

from __future__ import annotations

from .backends import CudaGraphBackend, ReplayBackend, make_backend
from .engine import BUDGET_FRACTION, MAX_ENGINES, GraphEngineCache
from .host import EngineHost

__all__ = [
    "BUDGET_FRACTION",
    "MAX_ENGINES",
    "CudaGraphBackend",
    "EngineHost",
    "GraphEngineCache",
    "ReplayBackend",
    "make_backend",
]
