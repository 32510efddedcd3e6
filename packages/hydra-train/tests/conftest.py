"""Shared pytest setup for hydra-train: the test directory on ``sys.path`` (for
:mod:`train_helpers`) and a guard that no test leaves global state behind: the default dtype
and the process group are checked; torch's global RNG (which every DataLoader iteration draws
from) is restored after each test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_global_state_left():
    dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        yield
    assert torch.get_default_dtype() == dtype, "a test changed the default dtype"
    assert not (dist.is_available() and dist.is_initialized()), "a test left a process group behind"


@pytest.fixture
def four_threads():
    """torch's intra-op thread count at 4 for the test (restored after it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)
