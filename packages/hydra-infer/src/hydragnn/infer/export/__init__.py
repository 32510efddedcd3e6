"""Export a HydraGNN interatomic potential to a file MD engines run without hydragnn.

``export_model("model.hydra", "model.pt2")`` (CLI: ``hydragnn-export``) writes an AOTInductor
package, a TorchScript file (``format="torchscript"``) or a metatomic model
(``format="metatomic"``, extra ``hydra-infer[metatomic]``), then checks the written file against
:class:`~hydragnn.infer.HydraCalculator`. :class:`ExportedModel` runs a ``.pt2`` / TorchScript
file; the exported function's inputs and outputs are described in :mod:`.graph`.
Names are imported on first use: importing this package loads no torch.
"""

from __future__ import annotations

from hydragnn.data.lazy import lazy_names

_LAZY: dict[str, str] = {
    "ExportError": "graph",
    "ExportReport": "api",
    "ExportedModel": "runtime",
    "describe": "runtime",
    "export_model": "api",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
