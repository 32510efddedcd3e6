"""CPU threading defaults for processes that share their cores, chosen only where the user has not.

OpenMP's default busy waiting made training 25-30x slower on a 2-core machine with one other
busy process; passive waiting (``OMP_WAIT_POLICY=PASSIVE``) brought it back at the same thread
count. OpenMP reads that variable once, when torch loads it, so ``import hydragnn.data`` (which
every HydraGNN layer imports before torch) sets it when it is unset and torch is not loaded yet.
The thread count: ``OMP_NUM_THREADS`` when given (torchrun gives 1 per rank when it is unset),
else the usable cores divided by the ranks on this node (``LOCAL_WORLD_SIZE``), so that the ranks
of a node never ask for more threads than there are cores. This module imports nothing heavy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

__all__ = ["choose_threads", "configure_threads", "prefer_passive_waiting"]

_PASSIVE_SET_HERE = False


def prefer_passive_waiting(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` when it is unset and torch (OpenMP) is not loaded yet."""
    global _PASSIVE_SET_HERE
    if "OMP_WAIT_POLICY" in environ or "torch" in sys.modules:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _PASSIVE_SET_HERE = environ is os.environ
    return True


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def choose_threads(environ: MutableMapping[str, str] = os.environ, cores: int | None = None) -> tuple[int, str]:
    """``(intra-op threads per process, why)``: ``OMP_NUM_THREADS`` when it is a positive
    integer, else ``cores`` (default: the usable cores) over ``LOCAL_WORLD_SIZE`` ranks, at least 1."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given), "OMP_NUM_THREADS"
    cores = _usable_cores() if cores is None else cores
    ranks = environ.get("LOCAL_WORLD_SIZE", "1").strip()
    ranks_n = int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1
    return max(1, cores // ranks_n), f"{cores} usable cores / {ranks_n} rank(s) on this node"


def configure_threads(environ: MutableMapping[str, str] = os.environ) -> str:
    """Apply :func:`choose_threads` to torch (lowering its count only, never raising it) and
    return a one-line notice of the threads and the OpenMP wait policy in force."""
    threads, why = choose_threads(environ)
    import torch

    if why != "OMP_NUM_THREADS" and torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    policy = environ.get("OMP_WAIT_POLICY")
    if policy is None:
        waiting = "OpenMP threads spin while waiting (set OMP_WAIT_POLICY=PASSIVE before Python starts on shared cores)"
    else:
        waiting = f"OpenMP waiting {policy.lower()}{' (set by hydragnn: it was unset)' if _PASSIVE_SET_HERE else ''}"
    return f"threads: {threads} per process ({why}); {waiting}"


prefer_passive_waiting()  # on import: hydragnn.data imports this module before anything loads torch
