"""Message-passing encoders and their registry (``mpnn_type`` -> class).

Every module named in :data:`_ENCODER_MODULES` is imported here; importing it registers its
encoder(s) with :func:`register_encoder`.
"""

import importlib

from ..encoder_configs import EncoderConfig
from .base import (
    ENCODERS,
    Encoder,
    EncoderDims,
    GraphInputs,
    NodeEmbedding,
    get_encoder,
    register_encoder,
)

# ---------------------------------------------------------------------------------------------
# Encoder modules. To add an encoder: put it in encoders/<module>.py, decorate its class with
# @register_encoder("Name"), and add "<module>" to this tuple (nothing else to edit).
_ENCODER_MODULES: tuple[str, ...] = (
    "allscaip",
    "cgcnn",
    "dimenet",
    "egnn",
    "gat",
    "gin",
    "mace",
    "mfc",
    "painn",
    "pna",
    "pnaeq",
    "pnaplus",
    "sage",
    "schnet",
    "uma",
)
# ---------------------------------------------------------------------------------------------

for _module in _ENCODER_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
del _module  # pyright: ignore[reportPossiblyUnbound, reportPossiblyUnboundVariable]  (the tuple is not empty)

__all__ = [
    "ENCODERS",
    "Encoder",
    "EncoderConfig",
    "EncoderDims",
    "GraphInputs",
    "NodeEmbedding",
    "get_encoder",
    "register_encoder",
]
