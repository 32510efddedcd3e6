"""Pytest plugin for ``qualify.py --accept``: lowers hydra-infer's validated runtime floors.

``HYDRAGNN_QUALIFY_ACCEPT`` holds ``dist=version`` pairs separated by commas (``torch=2.11``); each
replaces that distribution's entry of :data:`hydragnn.infer.modes.MIN_VERSIONS` for this process
only, so the engine's GPU tests run on a machine whose image holds an older torch than the one the
engine was validated with. The qualification report records every override it made.
"""

from __future__ import annotations

import os

ENV = "HYDRAGNN_QUALIFY_ACCEPT"


def parse(text: str) -> dict[str, tuple[int, ...]]:
    """``"torch=2.11,warp-lang=1.18"`` -> ``{"torch": (2, 11), "warp-lang": (1, 18)}``."""
    out: dict[str, tuple[int, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        dist, sep, version = item.partition("=")
        if not sep or not version:
            raise ValueError(f"--accept expects DIST=VERSION, got {item!r}")
        out[dist.strip()] = tuple(int(p) for p in version.strip().split("."))
    return out


def apply(floors: dict[str, tuple[int, ...]]) -> None:
    """Replace the named entries of ``MIN_VERSIONS`` in place (unknown names are refused)."""
    from hydragnn.infer import modes

    unknown = sorted(set(floors) - set(modes.MIN_VERSIONS))
    if unknown:
        raise ValueError(f"--accept names {unknown}; the engine's floors are {sorted(modes.MIN_VERSIONS)}")
    modes.MIN_VERSIONS.update(floors)


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest hook signature
    text = os.environ.get(ENV, "")
    if text:
        apply(parse(text))
