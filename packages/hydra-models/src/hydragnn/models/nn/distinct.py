"""The ``"distinct"`` execution (the ``"cpu"`` profile's): functions of the edge geometry evaluated once per
distinct value and gathered back.

Graphs on a lattice (fixed sites, species varying: HydraGNN's alloy and Ising data, upstream's
unit-test graphs) repeat a handful of distances across a whole batch, and both directions of an
edge have bitwise-equal lengths. Where the geometry is a constant of the call (no gradient to it:
no forces or stress by autograd), on CPU, outside compilation and with enough repetition
(:func:`~.edges.distinct_values`), a per-edge function of the length alone is evaluated per
distinct length: the same values, fewer rows. Everywhere else each implementation declines and
the primitive's own forward runs.

Registered here (:func:`~.backends.register_implementation`), switched in by a profile:

* :class:`~.conv.RadialFilter`: the filter MLP on the distinct lengths' basis values;
* :class:`~.geometry.TripletRows` (DimeNet): the spherical basis on the distinct
  ``(d_kj, cos angle)`` pairs of the triplets.
"""

from __future__ import annotations

import torch
from torch import nn

from .backends import ALL_FLOAT_DTYPES, Implementation, register_implementation
from .conv import RadialFilter
from .edges import RadialEdges, distinct_values
from .geometry import TripletRows

BACKEND = "distinct"


def _radial_filter(module: RadialFilter, edges: RadialEdges) -> torch.Tensor:
    shared = edges.shared_basis_values()
    if shared is None:
        return module.forward(edges)
    basis, inverse = shared
    return nn.Sequential.forward(module, basis).index_select(0, inverse)


def _triplet_rows(
    module: TripletRows, dist: torch.Tensor, cos_angle: torch.Tensor, idx_kj: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    by_length = distinct_values(dist)
    if by_length is None:
        return module.forward(dist, cos_angle, idx_kj)
    lengths, length_inverse = by_length
    cosines, cos_inverse = torch.unique(cos_angle, sorted=True, return_inverse=True)
    width = max(cosines.shape[0], 1)
    by_pair = distinct_values(length_inverse.index_select(0, idx_kj) * width + cos_inverse)
    if by_pair is None:
        return module.forward(dist, cos_angle, idx_kj)
    keys, expand = by_pair
    return lengths, keys // width, cosines.index_select(0, keys % width), expand


def _accepts_all(module: nn.Module) -> str | None:
    return None


register_implementation(Implementation(RadialFilter, BACKEND, _radial_filter, _accepts_all, ALL_FLOAT_DTYPES))
register_implementation(Implementation(TripletRows, BACKEND, _triplet_rows, _accepts_all, ALL_FLOAT_DTYPES))
