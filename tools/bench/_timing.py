"""Shared by the benchmark scripts (not a benchmark itself: ``nox -s bench`` skips ``_*.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(step: Callable[[], None], warmup: int, repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``step`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
