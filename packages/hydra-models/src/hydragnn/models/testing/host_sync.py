"""Host-synchronisation detector: the one the capture-safety checks and the tests use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from torch._ops import OpOverload


class HostSyncDetector(TorchDispatchMode):
    """Records ops that synchronise with the host or have data-dependent output shapes."""

    FORBIDDEN = frozenset(
        {
            "aten::_local_scalar_dense",
            "aten::item",
            "aten::is_nonzero",
            "aten::equal",
            "aten::nonzero",
            "aten::masked_select",
            "aten::_unique",
            "aten::_unique2",
            "aten::unique_dim",
            "aten::unique_consecutive",
            "aten::bincount",
        }
    )

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def __torch_dispatch__(
        self, func: OpOverload, types: Sequence[type], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name in self.FORBIDDEN:
            self.violations.append(name)
        elif name in ("aten::index", "aten::index_put", "aten::index_put_") and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] if len(args) > 1 else ())
        ):
            self.violations.append(f"{name} with a boolean mask")
        elif name == "aten::repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
            self.violations.append("aten::repeat_interleave without output_size")
        return func(*args, **kwargs)
