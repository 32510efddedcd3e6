"""hydra-infer: production inference for HydraGNN models.

``HydraCalculator(model_or_artifact_path)`` predicts energies (eV), forces (eV/Å), stress
(eV/Å³) and every other head from raw coordinates, in regular or ``torch.compile`` mode, with
CUDA-graph and inference-kernel modes that fall back (one warning per reason) where they do
not apply. ``HydraASECalculator`` adapts it to ASE; ``HydraTorchSimModel`` (imported lazily,
extra ``hydra-infer[torchsim]``) to torch-sim.
"""

from __future__ import annotations

from typing import Any

import hydragnn.data  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)

from .__about__ import __version__
from .ase import HydraASECalculator
from .calculator import HydraCalculator
from .errors import HydraInferWarning, InferenceError
from .modes import ENV_CUDA_GRAPH

__all__ = [
    "ENV_CUDA_GRAPH",
    "HydraASECalculator",
    "HydraCalculator",
    "HydraInferWarning",
    "HydraTorchSimModel",
    "InferenceError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "HydraTorchSimModel":  # torch-sim is optional: import it only when asked
        from .torchsim import HydraTorchSimModel

        return HydraTorchSimModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
