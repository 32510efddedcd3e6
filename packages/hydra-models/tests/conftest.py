"""Shared pytest setup for hydra-models: markers, the test-data directory on ``sys.path``, and
a guard that no test leaves global torch state behind.

Test data lives in :mod:`graphs` (tiny EMT Cu-Au structures, brute-force edges); the reusable
encoder checks live in :mod:`conformance`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import conformance  # noqa: E402,F401  (snapshots the encoder registry before test modules load)
from graphs import CLUSTER_SCHEMA, SCHEMA, cluster_samples, periodic_samples  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped without it")
    # The test graphs are tiny: intra-op threads only add OpenMP overhead (10-1000x on a busy
    # machine), and one thread makes timings reproducible.
    config._hydra_models_threads = torch.get_num_threads()
    torch.set_num_threads(1)


def pytest_unconfigure(config):
    threads = getattr(config, "_hydra_models_threads", None)
    if threads is not None:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_global_state_left():
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    assert torch.get_default_dtype() == dtype, "a test changed torch's default dtype"
    assert torch.is_grad_enabled() == grad, "a test left grad mode changed"


@pytest.fixture(scope="session")
def schema():
    """The MLIP test schema (energy, gap, atomic_energy, forces, charge, stress)."""
    return SCHEMA


@pytest.fixture(scope="session")
def cluster_schema():
    return CLUSTER_SCHEMA


@pytest.fixture(scope="session")
def periodic():
    """12 prepared periodic Cu-Au cells (4-8 atoms) with edges within 4 Å."""
    return periodic_samples(4.0)


@pytest.fixture(scope="session")
def clusters():
    """3 prepared non-periodic Cu-Au clusters with edges within 4 Å."""
    return cluster_samples(4.0)
