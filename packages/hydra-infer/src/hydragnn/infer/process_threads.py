"""The first calculator's word on the process's threads (importing ``hydragnn.infer`` sets none).

:func:`threads_notice` applies :func:`hydragnn.data.configure_threads` once per process and prints
its one-line notice. A script of one's own usually imports torch before anything could set
``OMP_WAIT_POLICY=PASSIVE``; OpenMP then spins while it waits, and with another busy process on
the cores every call slows. Measured on 2 cores with one busy elsewhere, a 108-atom NVE run in
ASE: 68 steps/s spinning on 2 threads, 123 passive on 2, 160 on one thread (idle: 155-189, 79-87,
126-137). So the notice warns once, naming the fix, where neither variable was chosen.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping

import torch

from hydragnn.data.threads import configure_threads

from .errors import HydraInferWarning

__all__ = ["SPINNING", "threads_notice"]

_THREADS: list[str] = []


SPINNING = (
    "hydragnn.infer: OpenMP's threads spin while they wait (torch loaded before "
    "hydragnn.data.configure_threads() could set OMP_WAIT_POLICY=PASSIVE): with another busy process on the "
    "cores, each call slows 2-3x (108-atom MD: 68 steps/s against 160 on one thread). Set OMP_NUM_THREADS=1 "
    "(structures of a few hundred atoms) or OMP_WAIT_POLICY=PASSIVE before starting Python, or call "
    "hydragnn.data.configure_threads() first in your script"
)
"""The warning of :func:`threads_notice` when OpenMP spins on more than one thread nobody chose."""


def threads_notice(environ: Mapping[str, str] = os.environ) -> str:
    """:func:`configure_threads` applied once per process (explicitly: importing
    ``hydragnn.infer`` changes nothing), its one-line notice printed to stderr; and, once, a
    :class:`HydraInferWarning` (:data:`SPINNING`) when OpenMP's busy waiting is in force on more than one
    intra-op thread and neither ``OMP_WAIT_POLICY`` nor ``OMP_NUM_THREADS`` was chosen (torch was
    loaded before the policy could be set: a script of one's own)."""
    if not _THREADS:
        _THREADS.append(configure_threads())
        print(f"hydragnn.infer: {_THREADS[0]}", file=sys.stderr)
        chosen = "OMP_WAIT_POLICY" in environ or "OMP_NUM_THREADS" in environ
        if not chosen and torch.get_num_threads() > 1:
            warnings.warn(SPINNING, HydraInferWarning, stacklevel=3)
    return _THREADS[0]
