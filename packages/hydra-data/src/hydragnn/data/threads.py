"""A read-only diagnosis of OpenMP busy waiting, shared by the conversion of a file and the calculator.

Nothing here changes the process: the process tuning that used to live here (``configure_threads``,
``compile_kwargs``, ...) is an execution choice and moved to :mod:`hydragnn.models.execution`
(hydra-models). This module imports nothing heavy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["SPINNING", "spinning_notice", "spinning_threads"]

SPINNING = (
    "OpenMP's {threads} intra-op threads spin while they wait (torch loaded before OMP_WAIT_POLICY=PASSIVE "
    "could be set): with another busy process on the cores, work slows 1.5-3x (108-atom MD: 68 steps/s against "
    "160 on one thread; converting 3,000 cells of 32 atoms: 3.8 s against 2.4 s). Set OMP_NUM_THREADS=1 "
    "(structures of a few hundred atoms) or OMP_WAIT_POLICY=PASSIVE before starting Python, or call "
    "hydragnn.models.execution.configure_threads() first in your script"
)
"""The advice of :func:`spinning_notice` (``{threads}``: the count)."""

_SPINNING_TOLD = False


def spinning_threads(environ: Mapping[str, str] = os.environ) -> int:
    """The intra-op threads that busy-wait because nobody chose otherwise, or 0.

    Non-zero when torch is loaded and runs more than one intra-op thread while neither
    ``OMP_WAIT_POLICY`` nor ``OMP_NUM_THREADS`` is set: a script of one's own that imported torch
    before passive waiting could be set (OpenMP reads the policy once, when torch loads it)."""
    torch = sys.modules.get("torch")
    if torch is None or "OMP_WAIT_POLICY" in environ or "OMP_NUM_THREADS" in environ:
        return 0
    threads = torch.get_num_threads()
    return threads if threads > 1 else 0


def spinning_notice(environ: Mapping[str, str] = os.environ) -> str | None:
    """:data:`SPINNING` the first time per process that :func:`spinning_threads` is non-zero, else
    None. The calculator and the conversion of a file warn with it (each in its own warning
    category), so a process is told once, and nothing about it changes: the fix is the user's."""
    global _SPINNING_TOLD
    threads = spinning_threads(environ)
    if _SPINNING_TOLD or not threads:
        return None
    _SPINNING_TOLD = True
    return SPINNING.format(threads=threads)
