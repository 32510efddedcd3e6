"""hydra-models: the HydraGNN model layer.

``build_model(config["NeuralNetwork"]["Architecture"], schema)`` builds a :class:`HydraModel`:
one message-passing encoder chosen by ``mpnn_type`` from :data:`ENCODERS`, graph / node / edge
heads for every output of the schema, and, for an interatomic potential, energy as a sum of
per-atom energies with forces ``-dE/dpos`` and stress by autograd. ``save_artifact`` /
``load_artifact`` write and read the one-file model artifact (JSON manifest + safetensors).
"""

import hydragnn.data  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)

from .__about__ import __version__
from .artifact import FORMAT_VERSION, load_artifact, read_manifest, save_artifact
from .attention.performer import redraw_projections
from .config import HeadsConfig, ModelConfig
from .encoders import (
    ENCODERS,
    Encoder,
    EncoderConfig,
    EncoderDims,
    GraphInputs,
    NodeEmbedding,
    get_encoder,
    register_encoder,
)
from .errors import ArtifactError, ModelConfigError, ModelError
from .loss import compute_loss
from .model import HydraModel, build_model
from .padding import pad_with_sink

__all__ = [
    "__version__",
    "ENCODERS",
    "FORMAT_VERSION",
    "ArtifactError",
    "Encoder",
    "EncoderConfig",
    "EncoderDims",
    "GraphInputs",
    "HeadsConfig",
    "HydraModel",
    "ModelConfig",
    "ModelConfigError",
    "ModelError",
    "NodeEmbedding",
    "build_model",
    "compute_loss",
    "get_encoder",
    "load_artifact",
    "pad_with_sink",
    "read_manifest",
    "redraw_projections",
    "register_encoder",
    "save_artifact",
]
