"""SAGE: GraphSAGE convolutions with a smooth, radially gated neighbour mean.

``x_i' = W_l (sum_j g_ij * x_j) / sqrt(1 + d_i^2) + W_r x_i`` with the continuous filter
``g_ij = env(r_ij) * W e_ij`` and the envelope-weighted degree ``d_i = sum_j env(r_ij)``
(a smooth version of GraphSAGE's mean), built on PyG's :class:`~torch_geometric.nn.conv.SAGEConv`.
"""

from __future__ import annotations

from torch import nn

from ..encoder_configs.invariant import SAGEConfig
from ..nn.sage import GatedSAGEConv
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder


@register_encoder("SAGE")
class SAGEEncoder(InvariantEncoder[SAGEConfig]):
    """Stack of :class:`GatedSAGEConv` (see the module docstring)."""

    Config = SAGEConfig

    def make_conv(self, dims: EncoderDims, config: SAGEConfig, edge_dim: int) -> nn.Module:
        return GatedSAGEConv(dims.hidden_dim, edge_dim)
