"""Shared building blocks of the encoders, heads and the MLIP wrapper.

Radial bases and cutoffs (:mod:`.radial`), NaN-safe edge and pair geometry with the minimum
image (:mod:`.geometry`), scatter reductions (:mod:`.scatter`), activations (:mod:`.activations`),
the continuous-filter convolution (:mod:`.conv`) and PaiNN's message / update ops (:mod:`.painn`).
The blocks of single encoder families are imported by those encoders, not here (they need e3nn
or PyG's convolutions): MACE's e3nn blocks (:mod:`.mace`, their dense execution
:mod:`.channel_tp`, e3nn typing shims :mod:`._e3nn`), DimeNet's bases and triplet lists
(:mod:`.dimenet_basis`, :mod:`.triplets`) and the convolutions of PNA (:mod:`.pna`), GIN
(:mod:`.gin`), CGCNN (:mod:`.cgcnn`), GAT (:mod:`.gat`), SAGE (:mod:`.sage`) and MFC (:mod:`.mfc`,
with the smooth degrees of :mod:`.degree`).
The swappable ones are :class:`~.backends.Primitive` subclasses: their stock forward is the
reference, and a backend registered with :func:`~.backends.register_implementation` replaces
its execution for every encoder that uses it where an execution profile switches it in
(:func:`~.backends.use_backend`; :mod:`hydragnn.models.execution`).
:func:`~.backends.execution_choices` lists them all.
"""

from . import distinct  # noqa: F401  (registers the "distinct" implementations)
from .backends import (
    BackendReport,
    Implementation,
    Primitive,
    execution_choices,
    implementations,
    register_implementation,
    use_backend,
)
from .conv import ContinuousFilterConv, RadialFilter
from .edges import RadialEdges
from .geometry import TripletRows
from .painn import EquivariantMessage, PaiNNUpdate
from .radial import BesselRBF, CosineCutoff, GaussianRBF, PolynomialCutoff

__all__ = [
    "BackendReport",
    "BesselRBF",
    "ContinuousFilterConv",
    "CosineCutoff",
    "EquivariantMessage",
    "GaussianRBF",
    "Implementation",
    "PaiNNUpdate",
    "PolynomialCutoff",
    "Primitive",
    "RadialEdges",
    "RadialFilter",
    "TripletRows",
    "execution_choices",
    "implementations",
    "register_implementation",
    "use_backend",
]
