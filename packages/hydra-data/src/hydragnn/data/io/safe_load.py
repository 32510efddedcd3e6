"""``torch.load`` restricted to tensors and plain containers, with errors that say what is wrong.

``torch.load(weights_only=True)`` refuses pickled code, but its message starts with advice to
retry with ``weights_only=False`` (which would run that code) and buries the cause. Every layer
loads ``.pt`` bytes through :func:`load_tensors` and reports :func:`load_error_cause` instead.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import torch

_CAUSES = (
    re.compile(r"(Trying to load unsupported GLOBAL .*?)(?: whose module .* is blocked)?\.?$", re.IGNORECASE),
    re.compile(r"(Unsupported global: .*)$", re.IGNORECASE),
    re.compile(r"WeightsUnpickler error: (.*)$", re.IGNORECASE),
)


def load_error_cause(exc: BaseException) -> str:
    """One line saying why ``torch.load`` failed: the refused global, or the first sentence of the
    reader's error (never torch's suggestion to load with ``weights_only=False``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        for pattern in _CAUSES:
            match = pattern.search(line)
            if match:
                return f"it holds a Python object, not only tensors ({match.group(1).rstrip('.')}); it was not loaded"
    useful = [line for line in lines if "weights_only" not in line and "documentation" not in line]
    first = (useful or lines or [type(exc).__name__])[0]
    return first.split(". ")[0].rstrip(".")


def load_tensors(data: bytes, safe_globals: Sequence[Any] = ()) -> Any:
    """``torch.load`` of ``data`` on the CPU with ``weights_only=True`` (plus ``safe_globals``).

    Raises:
        ValueError: with :func:`load_error_cause` as its message.
    """
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(load_error_cause(exc)) from None
