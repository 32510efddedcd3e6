"""Which exceptions of a capture, check or replay the engine may answer with the regular path."""

from __future__ import annotations

import torch

FATAL_CUDA_ERRORS = (
    "illegal memory access",
    "an illegal instruction",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "cudaErrorIllegalAddress",
    "cudaErrorAssert",
    "cudaErrorLaunchFailure",
)
"""Messages of CUDA errors that leave the context unusable: re-raised, never answered by a fallback."""


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error after which the context cannot be used (see :data:`FATAL_CUDA_ERRORS`)."""
    text = str(exc)
    return any(marker in text for marker in FATAL_CUDA_ERRORS)


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
