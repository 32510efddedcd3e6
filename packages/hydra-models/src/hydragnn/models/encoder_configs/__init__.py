"""Encoder configs, torch-free: every encoder's ``Architecture`` keys and the config registry.

``ENCODER_CONFIGS`` maps each ``mpnn_type`` to an :class:`EncoderEntry` (its config class and the
capabilities config checks read), so ``ModelConfig.from_dict`` validates a whole
``Architecture`` section without importing an encoder, torch or an optional backend. The
encoders (:mod:`hydragnn.models.encoders`) take these classes as their ``Config``; registering an
encoder checks that they agree, and registers the config of an encoder defined elsewhere.

To add an encoder's keys: a frozen :class:`EncoderConfig` subclass in one of the modules below
(:mod:`.invariant`: PyG convolutions; :mod:`.geometric`: own geometry blocks; :mod:`.fairchem`),
decorated ``@register_encoder_config("Name")`` with its capabilities.
"""

from . import fairchem, geometric, invariant  # noqa: F401  (register the built-in encoders' configs)
from .base import (
    ENCODER_CONFIGS,
    ROOT,
    EncoderConfig,
    EncoderEntry,
    add_encoder_config,
    encoder_entry,
    register_encoder_config,
    unknown_encoder,
)
from .fairchem import AllScAIPConfig, UMAConfig
from .geometric import DimeNetConfig, EGNNConfig, MACEConfig, PAINNConfig, PNAEqConfig, SchNetConfig
from .invariant import (
    CGCNNConfig,
    GATConfig,
    GINConfig,
    InvariantConfig,
    MFCConfig,
    PNAConfig,
    PNAPlusConfig,
    SAGEConfig,
)

__all__ = [
    "ENCODER_CONFIGS",
    "ROOT",
    "AllScAIPConfig",
    "CGCNNConfig",
    "DimeNetConfig",
    "EGNNConfig",
    "EncoderConfig",
    "EncoderEntry",
    "GATConfig",
    "GINConfig",
    "InvariantConfig",
    "MACEConfig",
    "MFCConfig",
    "PAINNConfig",
    "PNAConfig",
    "PNAEqConfig",
    "PNAPlusConfig",
    "SAGEConfig",
    "SchNetConfig",
    "UMAConfig",
    "add_encoder_config",
    "encoder_entry",
    "register_encoder_config",
    "unknown_encoder",
]
