"""Subnormal detector: ops whose floating-point outputs hold subnormal values.

x86 arithmetic on subnormals (below ``finfo.tiny``, e.g. 1.2e-38 in float32) takes microcode
assists: a matrix product whose input held them ran 20-50x slower. A model should not produce
them in ordinary use; this mode names the ops that do. Outputs of allocation ops (``empty``,
``new_empty`` ...: uninitialised memory) and zero tensors (no storage) are not inspected.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from torch._ops import OpOverload


class SubnormalDetector(TorchDispatchMode):
    """Counts subnormal elements per op name in ``found`` (``{op: count}``) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.found: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(
        self, func: OpOverload, types: Sequence[type], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if "empty" in name or "zerotensor" in name:  # uninitialised memory / no storage
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and not t.is_meta:
                count = int(((t.abs() < torch.finfo(t.dtype).tiny) & (t != 0)).sum())
                if count:
                    self.found[name] += count
        return out
