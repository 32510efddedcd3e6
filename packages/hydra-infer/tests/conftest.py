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
def graph_backend(monkeypatch):
    """Install the CPU replay backend for the ``cuda_graph=True`` calculators this test builds.

    Their CUDA-graph engine then runs the same static-buffer code path as real capture, on any
    device (:data:`hydragnn.infer.modes.installed_graph_backend`, restored after the test). The
    value is ``install(backend)``: another backend (a ``ReplayBackend(perturb=...)``, or ``None``
    for none) for the calculators built after the call.
    """
    from hydragnn.infer import modes

    def install(backend: Any = "replay") -> None:
        monkeypatch.setattr(modes, "installed_graph_backend", backend)

    install()
    return install


@pytest.fixture
def graph_calc(graph_backend):
    """``graph_calc(model, backend="replay", **kwargs)``: a ``cuda_graph=True`` calculator whose
    engine runs on ``backend`` (see :func:`graph_backend`)."""
    from hydragnn.infer import HydraCalculator

    def build(model, backend: Any = "replay", **kwargs) -> HydraCalculator:
        graph_backend(backend)
        return HydraCalculator(model, cuda_graph=True, **kwargs)

    return build
