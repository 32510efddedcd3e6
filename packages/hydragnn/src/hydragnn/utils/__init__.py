"""``hydragnn.utils``: the seed's module paths for utilities; :mod:`.model` holds the checkpoint
functions (``save_model``, ``load_existing_model``, ``load_model``).

``hydragnn.utils.model`` is imported on first attribute access, so ``import hydragnn.utils``
loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
