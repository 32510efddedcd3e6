"""Shared building blocks of the encoders, heads and the MLIP wrapper.

Radial bases and cutoffs (:mod:`.radial`), NaN-safe edge and pair geometry with the minimum
image (:mod:`.geometry`), scatter reductions (:mod:`.scatter`), activations (:mod:`.activations`),
the continuous-filter convolution (:mod:`.conv`) and PaiNN's message / update ops (:mod:`.painn`).
The swappable ones are :class:`~.backends.Primitive` subclasses: their stock forward is the
reference, and a backend registered with :func:`~.backends.register_implementation` replaces
its execution for every encoder that uses it (:func:`~.backends.use_backend`).
"""

from .backends import BackendReport, Implementation, Primitive, implementations, register_implementation, use_backend
from .conv import ContinuousFilterConv, RadialFilter
from .edges import RadialEdges
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
    "implementations",
    "register_implementation",
    "use_backend",
]
