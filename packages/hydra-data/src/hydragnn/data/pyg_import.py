"""PyTorch Geometric, imported as HydraGNN needs it: importing this module imports ``torch_geometric``.

Every ``hydragnn`` module that uses PyG imports this module before ``torch_geometric`` (ruff's
isort section ``pyg-import`` in pyproject.toml keeps it above the third-party imports;
``packages/hydra-data/tests/test_pyg_import.py`` checks every module), so whichever module a user
imports first, PyG's import is followed by :func:`~hydragnn.data.pyg_compat.keep_scripting_builtins`
(TorchScript keeps ``torch.index_select``; metatomic can be imported after) and runs inside
:func:`~hydragnn.data.pyg_compat.torchscript_quietly` (PyG scripts a class at import, which torch
2.14 reports as deprecated). Nothing else about the process changes.
"""

from __future__ import annotations

from .pyg_compat import keep_scripting_builtins, torchscript_quietly

with torchscript_quietly():
    import torch_geometric  # noqa: F401

keep_scripting_builtins()
