"""Shared setup for hydra-infer tests: one torch thread, the testing-only CUDA-graph backend
(fixtures ``graph_backend`` and ``graph_calc``); helpers live in :mod:`infer_helpers`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from infer_helpers import tiny_model  # noqa: E402

from hydragnn.data.emt import generate_cuau_atoms  # noqa: E402


def pytest_configure(config):
    config._hydra_infer_threads = torch.get_num_threads()
    torch.set_num_threads(1)


def pytest_unconfigure(config):
    threads = getattr(config, "_hydra_infer_threads", None)
    if threads is not None:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def model64():
    """An untrained fp64 SchNet MLIP (energy, atomic_energy, forces, stress), cutoff 4 Å."""
    return tiny_model()


@pytest.fixture(scope="session")
def cuau_atoms():
    """Four 32-atom EMT Cu-Au cells."""
    return generate_cuau_atoms(4, seed=1)


@pytest.fixture
def graph_calc():
    """``graph_calc(model, backend="replay", **kwargs)``: a ``cuda_graph=True`` calculator whose
    CUDA-graph runner runs on ``backend`` (the CPU replay backend by default: the same
    static-buffer code path as real capture, on any device)."""
    from hydragnn.infer import HydraCalculator

    def build(model, backend: Any = "replay", **kwargs) -> HydraCalculator:
        return HydraCalculator(model, cuda_graph=True, graph_backend=backend, **kwargs)

    return build
