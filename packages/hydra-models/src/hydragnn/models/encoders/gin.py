"""GIN: graph isomorphism network convolutions with radially gated neighbour messages.

``x_i' = MLP((1 + eps) x_i + sum_j g_ij * x_j)`` with the continuous filter
``g_ij = env(r_ij) * W e_ij`` (``e_ij`` = radial basis of the distance and edge inputs), built
on PyG's :class:`~torch_geometric.nn.conv.GINConv`. Messages vanish smoothly at the cutoff.
"""

from __future__ import annotations

from torch import nn

from ..encoder_configs.invariant import GINConfig
from ..nn.gin import GatedGINConv
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder


@register_encoder("GIN")
class GINEncoder(InvariantEncoder[GINConfig]):
    """Stack of :class:`GatedGINConv` (see the module docstring)."""

    Config = GINConfig

    def make_conv(self, dims: EncoderDims, config: GINConfig, edge_dim: int) -> nn.Module:
        return GatedGINConv(dims.hidden_dim, edge_dim, config.activation, config.eps, config.train_eps)
