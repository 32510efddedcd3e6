"""The first calculator's word on the process's threads (importing ``hydragnn.infer`` sets none).

:func:`threads_notice` applies the execution profile's process tuning
(:meth:`hydragnn.models.execution.Execution.configure_process`) once per process and prints its
one-line notice. A script of one's own usually imports torch before anything could set
``OMP_WAIT_POLICY=PASSIVE``; OpenMP then spins while it waits, and with another busy process on
the cores every call slows. Measured on 2 cores with one busy elsewhere, a 108-atom NVE run in
ASE: 68 steps/s spinning on 2 threads, 123 passive on 2, 160 on one thread (idle: 155-189, 79-87,
126-137). So the first calculator warns once, naming the fix, where neither variable was chosen,
whatever the profile (the warning changes nothing).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping

from hydragnn.data.threads import spinning_notice
from hydragnn.models.execution import Execution

from .errors import HydraInferWarning

__all__ = ["threads_notice"]

_THREADS: list[str] = []


def threads_notice(execution: Execution, environ: Mapping[str, str] = os.environ) -> str | None:
    """``execution``'s process tuning applied once per process (explicitly: importing
    ``hydragnn.infer`` changes nothing), its one-line notice printed to stderr (None under a
    profile that leaves the process alone); and a :class:`HydraInferWarning` with
    :func:`~hydragnn.data.threads.spinning_notice`'s advice when OpenMP busy-waits on more than one
    intra-op thread nobody chose (once per process, shared with the conversion of a file)."""
    if not _THREADS and (notice := execution.configure_process()) is not None:
        _THREADS.append(notice)
        print(f"hydragnn.infer: {notice}", file=sys.stderr)
    if (advice := spinning_notice(environ)) is not None:
        warnings.warn(f"hydragnn.infer: {advice}", HydraInferWarning, stacklevel=3)
    return _THREADS[0] if _THREADS else None
