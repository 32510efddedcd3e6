"""Shared pytest setup for hydra-models: markers, the conformance settings of the built-in
encoders, and a guard that no test leaves global torch state behind.

Test data (tiny EMT Cu-Au structures, brute-force edges) and the reusable encoder checks ship
in :mod:`hydragnn.models.testing`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # test modules import each other (test_learning's recipe)

from hydragnn.models.testing import set_defaults  # noqa: E402
from hydragnn.models.testing.graphs import CLUSTER_SCHEMA, SCHEMA, cluster_samples, periodic_samples  # noqa: E402

# Conformance settings of the built-in encoders (test settings, kept out of the encoder classes).
# DimeNet: the capture-safety check needs the fixed triplet layout (in-degrees here are <= 18).
set_defaults("DimeNet", arch={"triplet_capacity": 32})
set_defaults("UMA", arch={"lmax": 1, "mmax": 1})  # tiny: l <= 1
set_defaults(
    "AllScAIP",
    skips={
        "finite_differences": "computes in float32 (fairchem's frequency features are float32): the float64 "
        "check cannot hold; a float32 finite-difference check replaces it",
    },
)


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
