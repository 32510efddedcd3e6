"""HydraGNN: the top-level package, from the ``hydragnn`` distribution (all four layers).

``pip install hydragnn`` brings hydra-data, hydra-models, hydra-train and hydra-infer, and this
file, which gives the seed's Quick Start its names after a bare ``import hydragnn``:
``hydragnn.data``, ``hydragnn.models``, ``hydragnn.train``, ``hydragnn.infer`` (the layers),
``hydragnn.preprocess`` (``create_dataloaders``) and ``hydragnn.utils`` (``utils.model``:
``save_model``, ``load_existing_model``, ``load_model``). Each is imported on first attribute
access (PEP 562), so ``import hydragnn`` alone loads no torch.

The four layers ship no ``hydragnn/__init__.py`` and install and import alone, ``hydragnn`` then
being a PEP 420 namespace. With this distribution installed, ``hydragnn`` is a regular package
whose ``__path__`` still reaches every layer: installed as wheels they share this folder, and
installed editable (or on several ``sys.path`` entries) each has its own ``src/hydragnn``, which
:func:`pkgutil.extend_path` adds when ``hydragnn`` is first imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

__path__ = pkgutil.extend_path(__path__, __name__)

from .__about__ import __version__  # noqa: E402  (after __path__: the layers' folders first)

# attribute -> distribution that ships it (named in the error when it is not installed)
_SUBPACKAGES: dict[str, str] = {
    "data": "hydra-data",
    "models": "hydra-models",
    "train": "hydra-train",
    "infer": "hydra-infer",
    "preprocess": "hydragnn",
    "utils": "hydragnn",
}

__all__ = ["__version__", *_SUBPACKAGES]


def __getattr__(name: str) -> Any:
    """Import the subpackage ``hydragnn.<name>`` on first use (it then stays an attribute)."""
    dist = _SUBPACKAGES.get(name)
    if dist is None:
        raise AttributeError(f"module 'hydragnn' has no attribute {name!r}; its subpackages: {sorted(_SUBPACKAGES)}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the subpackage exists and one of its own imports failed: that error, unchanged
        raise AttributeError(f"hydragnn.{name} is not installed: pip install {dist}") from exc


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBPACKAGES))
