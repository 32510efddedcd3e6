"""``torch.load`` restricted to tensors and plain containers, with errors that say what is wrong.

``torch.load(weights_only=True)`` refuses pickled code, but its message starts with advice to
retry with ``weights_only=False`` (which would run that code) and buries the cause. Every layer
loads ``.pt`` bytes through :func:`load_tensors` and reports :func:`load_error_cause` instead.

A ``.pt`` file stores each tensor as a storage plus its size and strides, and ``torch.load``
rebuilds whatever view those declare: a one-byte storage with a zero stride loads as a tensor of
a billion elements, which the first copy (``.to``, ``.tolist``, ``.clone``) then allocates.
:func:`load_tensors` refuses a tensor with more element bytes than its storage holds (declared
sizes bounded by the bytes present, before anything is allocated), and with ``max_bytes``, a file
whose tensors together declare more than that.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
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


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 64 and isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, depth + 1)
    elif depth < 64 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1)
    elif depth < 64 and hasattr(obj, "__dict__") and not isinstance(obj, type):  # a PyG Data's stores
        yield from _tensors(vars(obj), depth + 1)


def unbacked(obj: Any, max_bytes: int | None = None) -> str | None:
    """Why the tensors of a loaded object declare more than their bytes hold, or ``None``: a
    tensor whose elements outnumber its storage's (a zero-stride or overlapping view), or (with
    ``max_bytes``) tensors declaring more element bytes than that in all."""
    total = 0
    for t in _tensors(obj):
        need = t.numel() * t.element_size()
        have = t.untyped_storage().nbytes()
        if need > have:
            return (
                f"a tensor of shape {tuple(t.shape)} declares {need} bytes over a storage of {have} bytes "
                "(a zero-stride or overlapping view: a crafted size)"
            )
        total += need
        if max_bytes is not None and total > max_bytes:
            return f"its tensors declare more than {max_bytes} bytes, more than the file's bytes can hold"
    return None


def load_tensors(data: bytes, safe_globals: Sequence[Any] = (), *, max_bytes: int | None = None) -> Any:
    """``torch.load`` of ``data`` on the CPU with ``weights_only=True`` (plus ``safe_globals``),
    refused when a tensor declares more elements than its stored bytes (:func:`unbacked`).

    Args:
        max_bytes: also refuse tensors declaring more element bytes than this in all (a reader's
            bound from the file's size, where tensors are not expected to share storage).

    Raises:
        ValueError: with :func:`load_error_cause` as its message, or the :func:`unbacked` reason.
    """
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(load_error_cause(exc)) from None
    problem = unbacked(obj, max_bytes)
    if problem is not None:
        raise ValueError(problem)
    return obj
