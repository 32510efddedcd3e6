"""Importing nvalchemi-toolkit-ops (and so Warp) lazily, once, without Warp's CUDA notice on CPU.

``import nvalchemiops`` initialises Warp, whose native library prints ``Warp CUDA warning: Could
not find or load the NVIDIA CUDA driver...`` to the process's stderr when there is no driver: a
line on every CPU run that tells a CPU user nothing. The importers here load a module on first
use (``functools.cache``), with file descriptor 2 sent to a temporary file while Warp starts when
torch sees no CUDA device, then write back everything else that was printed meanwhile (nothing
is lost; only that one line is dropped):

- :func:`nvalchemi_core_neighbors`: ``nvalchemiops.neighbors``, the Warp-level launchers that
  :mod:`hydragnn.data.neighbors` calls on torch buffers (:mod:`.warp`); about 1 s with
  Warp itself.
- :func:`nvalchemi_neighbors`: ``nvalchemiops.torch.neighbors``, the torch adapters, still used
  by hydra-infer's CUDA-graph periodic engine. Its package import also defines nvalchemi's
  optimiser and integrator kernels: about 2 s more.

Warp's kernel cache is its default per-user folder (``~/.cache/warp``, or ``WARP_CACHE_PATH``), so
a new process loads compiled kernels instead of compiling them again.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import tempfile
from types import ModuleType

CUDA_NOTICE = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"


def import_without_cuda_notice(name: str) -> ModuleType:
    """``importlib.import_module(name)``, dropping Warp's no-driver line from stderr when torch has no CUDA."""
    import torch

    if "warp" in sys.modules or torch.cuda.is_available():
        return importlib.import_module(name)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            return importlib.import_module(name)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(CUDA_NOTICE))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


@functools.cache
def nvalchemi_core_neighbors() -> ModuleType:
    """The ``nvalchemiops.neighbors`` module, Warp-level launchers (imported on first use: about 1 s)."""
    return import_without_cuda_notice("nvalchemiops.neighbors")


@functools.cache
def nvalchemi_neighbors() -> ModuleType:
    """The ``nvalchemiops.torch.neighbors`` module, torch adapters (imported on first use: seconds)."""
    return import_without_cuda_notice("nvalchemiops.torch.neighbors")
