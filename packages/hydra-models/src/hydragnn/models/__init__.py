"""hydra-models: the HydraGNN model layer.

``build_model(config["NeuralNetwork"]["Architecture"], schema)`` builds a :class:`HydraModel`:
one message-passing encoder chosen by ``mpnn_type`` from :data:`ENCODERS`, graph / node / edge
heads for every output of the schema, and, for an interatomic potential, energy as a sum of
per-atom energies with forces ``-dE/dpos`` and stress by autograd. ``save_artifact`` /
``load_artifact`` write and read the one-file model artifact (JSON manifest + safetensors).

Every public name is imported on first use (PEP 562): ``import hydragnn.models`` loads no torch.
"""

from hydragnn.data.lazy import lazy_names

from .__about__ import __version__

# public name -> submodule defining it
_LAZY: dict[str, str] = {
    "FORMAT_VERSION": "artifact",
    "load_artifact": "artifact",
    "read_manifest": "artifact",
    "save_artifact": "artifact",
    "redraw_projections": "attention.performer",
    "HeadsConfig": "config",
    "ModelConfig": "config",
    "ENCODER_CONFIGS": "encoder_configs",
    "EncoderConfig": "encoder_configs",
    "ENCODERS": "encoders",
    "Encoder": "encoders",
    "EncoderDims": "encoders",
    "GraphInputs": "encoders",
    "NodeEmbedding": "encoders",
    "get_encoder": "encoders",
    "register_encoder": "encoders",
    "ArtifactError": "errors",
    "ModelConfigError": "errors",
    "ModelError": "errors",
    "compute_loss": "loss",
    "atomic_energies": "locality",
    "local_energy": "locality",
    "locality_problems": "locality",
    "receptive_field": "locality",
    "Committee": "committee",
    "HydraModel": "model",
    "build_model": "build",
    "pad_with_sink": "padding",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
