"""Shared setup for hydra-infer tests: one torch thread; helpers live in :mod:`infer_helpers`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from infer_helpers import tiny_model  # noqa: E402

from hydragnn.data.reference import generate_cuau_atoms  # noqa: E402


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
