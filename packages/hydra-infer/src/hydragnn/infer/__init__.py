"""hydra-infer: production inference for HydraGNN models.

``HydraCalculator(model_or_artifact_path)`` predicts energies (eV), forces (eV/Å), stress
(eV/Å³) and every other head from raw coordinates, in regular or ``torch.compile`` mode, with
CUDA-graph and inference-kernel modes that fall back (one warning per reason) where they do
not apply. ``HydraASECalculator`` adapts it to ASE; ``HydraTorchSimModel`` (imported lazily,
extra ``hydra-infer[torchsim]``) to torch-sim. Beyond Python: :mod:`hydragnn.infer.export`
(``hydragnn-export``: AOTInductor, TorchScript and metatomic files that run without hydragnn),
:mod:`hydragnn.infer.lammps` (LAMMPS through ``fix external``) and :mod:`hydragnn.infer.evaluate`
(``hydragnn-evaluate``: errors on labelled structures).

Every public name is imported on first use (PEP 562): ``import hydragnn.infer`` loads no torch,
and torch-sim only when ``HydraTorchSimModel`` is asked for.
"""

from __future__ import annotations

from hydragnn.data.lazy import lazy_names

from .__about__ import __version__

# public name -> submodule defining it
_LAZY: dict[str, str] = {
    "ENV_CUDA_GRAPH": "modes",
    "ExtrapolationError": "uncertainty",
    "HydraASECalculator": "ase",
    "HydraCalculator": "calculator",
    "HydraInferWarning": "errors",
    "HydraTorchSimModel": "torchsim",
    "InferenceError": "errors",
    "NonFiniteOutput": "finite",
    "UncertaintyLimit": "uncertainty",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
