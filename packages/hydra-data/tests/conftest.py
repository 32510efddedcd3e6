"""hydra-data tests: the user cache (ADIOS2 writer key, verified datasets, downloads) lives in a
per-session temporary folder, never in the real ``~/.cache/hydragnn``."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_user_cache(tmp_path_factory):
    old = os.environ.get("HYDRAGNN_CACHE")
    os.environ["HYDRAGNN_CACHE"] = str(tmp_path_factory.mktemp("user-cache"))
    yield
    if old is None:
        os.environ.pop("HYDRAGNN_CACHE", None)
    else:
        os.environ["HYDRAGNN_CACHE"] = old
