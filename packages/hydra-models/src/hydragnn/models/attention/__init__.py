"""Global attention for HydraGNN encoders.

* :mod:`.gps`: GPS layers mixing global attention into every conv layer (``global_attn_engine: "GPS"``),
  with exact per-graph ``multihead`` attention or ``performer`` attention (:mod:`.performer`).
* :func:`redraw_projections`: redraw every performer projection of a model (used by the trainer).

The equivariant transformer lives in :mod:`.equivariant_transformer` (imported on demand).
"""

from .gps import GPSLayer, MultiheadAttention, build_gps_mixers
from .performer import PerformerAttention, orthogonal_gaussian, redraw_projections

__all__ = [
    "GPSLayer",
    "MultiheadAttention",
    "PerformerAttention",
    "build_gps_mixers",
    "orthogonal_gaussian",
    "redraw_projections",
]
