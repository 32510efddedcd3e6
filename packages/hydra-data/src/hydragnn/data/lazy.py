"""PEP 562 lazy public names, shared by the ``hydragnn.*`` packages.

A package lists ``public name -> module`` and gets a module ``__getattr__`` that imports the
module on first use (and keeps the value as a package attribute, so the import runs once) and a
``__dir__`` that lists every public name. ``import hydragnn.<pkg>`` then costs only its own
``__init__``: torch and PyTorch Geometric load when a name that needs them is first used (PyG through
:mod:`.pyg_import`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, table: Mapping[str, str], namespace: dict[str, Any], moved: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``) with its ``globals()`` as ``namespace``.

    Args:
        package: the package's ``__name__``.
        table: public name -> module defining it: a submodule name (``"schema"``), a relative
            module (``".config"``) or an absolute one (``"hydragnn.data"``).
        namespace: the package's ``globals()``; a loaded value is stored there.
        moved: name -> where it lives now, for names the package no longer has: the
            ``AttributeError`` says where to import them from.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            if moved and name in moved:
                raise AttributeError(f"{package}.{name} moved: import it from {moved[name]}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if not module.startswith((".", "hydragnn.")) and module != "hydragnn":
            module = "." + module
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
