"""SAGE: GraphSAGE convolutions with a smooth, radially gated neighbour mean.

``x_i' = W_l (sum_j g_ij * x_j) / sqrt(1 + d_i^2) + W_r x_i`` with the continuous filter
``g_ij = env(r_ij) * W e_ij`` and the envelope-weighted degree ``d_i = sum_j env(r_ij)``
(a smooth version of GraphSAGE's mean), built on PyG's :class:`~torch_geometric.nn.conv.SAGEConv`.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch_geometric.nn.conv import SAGEConv

from ..encoder_configs.invariant import SAGEConfig
from .base import EncoderDims, register_encoder
from .invariant_utils import Float32Aggregation, InvariantEncoder, smooth_count, soft_degree


class GatedSAGEConv(Float32Aggregation, SAGEConv):
    """:class:`SAGEConv` with gated messages and a smooth degree normalisation."""

    propagate_type = {"x": "Tensor", "gate": "Tensor"}

    def __init__(self, channels: int, edge_dim: int) -> None:
        super().__init__(channels, channels, aggr="sum", root_weight=True, normalize=False, project=False)
        self.gate = nn.Linear(edge_dim, channels) if edge_dim > 0 else None

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        gate = env if self.gate is None else self.gate(edge_feat) * env
        out = self.propagate(edge_index, x=x, gate=gate)
        out = out / smooth_count(soft_degree(env, edge_index[1], x.shape[0]))
        return self.lin_l(out) + self.lin_r(x)

    def message(self, x_j: Tensor, gate: Tensor) -> Tensor:  # type: ignore[override]
        return x_j * gate


@register_encoder("SAGE")
class SAGEEncoder(InvariantEncoder):
    """Stack of :class:`GatedSAGEConv` (see the module docstring)."""

    Config = SAGEConfig

    def make_conv(self, dims: EncoderDims, config: Config, edge_dim: int) -> nn.Module:
        return GatedSAGEConv(dims.hidden_dim, edge_dim)
