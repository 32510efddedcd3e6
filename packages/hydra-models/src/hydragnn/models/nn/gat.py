"""GAT's attention convolution on PyG's :class:`~torch_geometric.nn.conv.GATv2Conv`.

:class:`EnvelopeGATv2Conv` is the convolution of the GAT encoder
(:mod:`hydragnn.models.encoders.gat`, where the attention is described): GATv2 logits, per head
a softmax over the neighbours and one null key of logit 0 with each neighbour weighted by its
cutoff envelope, and values ``W_l x_j`` filtered by the edge features ``W_v e_ij``. No self loops
are added; the softmax runs in float32 when the model runs in bfloat16.
"""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.conv import GATv2Conv
from torch_geometric.utils import scatter

from .scatter import Float32Aggregation, accumulate_dtype


class EnvelopeGATv2Conv(Float32Aggregation, GATv2Conv):
    """:class:`GATv2Conv` with envelope-weighted null-key attention and radially filtered values.

    Called as ``conv(x [N, C], edge_index [2, E], edge_feat [E, D] or None, env [E, 1]) -> [N, C]``.
    Parameters beyond :class:`GATv2Conv`'s: ``lin_value`` (``W_v``, ``edge_dim -> heads * out_channels``,
    no bias), absent without edge features (the values are then unfiltered).
    """

    propagate_type = {"x": "Tuple[Tensor, Tensor]", "alpha": "Tensor", "value_filter": "OptTensor"}
    edge_updater_type = {"x": "Tuple[Tensor, Tensor]", "edge_attr": "OptTensor", "env": "Tensor"}

    def __init__(
        self, channels: int, edge_dim: int, heads: int, concat: bool, negative_slope: float, dropout: float
    ) -> None:
        out_channels = channels // heads if concat else channels
        super().__init__(
            channels,
            out_channels,
            heads=heads,
            concat=concat,
            negative_slope=negative_slope,
            dropout=dropout,
            add_self_loops=False,
            edge_dim=edge_dim if edge_dim > 0 else None,
            share_weights=False,
        )
        self.lin_value = nn.Linear(edge_dim, heads * out_channels, bias=False) if edge_dim > 0 else None

    def forward(  # type: ignore[override]
        self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor
    ) -> Tensor:
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        heads, channels = self.heads, self.out_channels
        x_l = self.lin_l(x).view(-1, heads, channels)  # values and source half of the logits
        x_r = self.lin_r(x).view(-1, heads, channels)  # target half of the logits
        alpha = self.edge_updater(edge_index, x=(x_l, x_r), edge_attr=edge_feat, env=env)  # [E, H]
        value_filter = None
        if self.lin_value is not None:
            assert edge_feat is not None
            value_filter = self.lin_value(edge_feat).view(-1, heads, channels)
        out = self.propagate(edge_index, x=(x_l, x_r), alpha=alpha, value_filter=value_filter)  # [N, H, C]
        out = out.reshape(-1, heads * channels) if self.concat else out.mean(dim=1)
        return out + self.bias if self.bias is not None else out

    def edge_update(  # type: ignore[override]
        self,
        x_j: Tensor,
        x_i: Tensor,
        edge_attr: Tensor | None,
        env: Tensor,
        index: Tensor,
        dim_size: int | None,
    ) -> Tensor:
        """Attention weights ``[E, H]`` (see :mod:`hydragnn.models.encoders.gat`)."""
        x = x_i + x_j
        if self.lin_edge is not None:
            assert edge_attr is not None
            x = x + self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)
        x = F.leaky_relu(x, self.negative_slope)
        logits = (x * self.att).sum(dim=-1)  # [E, H]
        acc = accumulate_dtype(logits.dtype)  # softmax of 16-bit logits in float32
        logits = logits.to(acc)
        shift = scatter(logits.detach(), index, dim=0, dim_size=dim_size, reduce="max").clamp(min=0.0)  # [N, H]
        weight = env.to(acc) * torch.exp(logits - shift.index_select(0, index))  # [E, H]
        norm = torch.exp(-shift) + scatter(weight, index, dim=0, dim_size=dim_size, reduce="sum")  # [N, H]
        alpha = (weight / norm.index_select(0, index)).to(x.dtype)
        return F.dropout(alpha, p=self.dropout, training=self.training)

    def message(self, x_j: Tensor, alpha: Tensor, value_filter: Tensor | None) -> Tensor:  # type: ignore[override]
        """``x_j [E, H, C]`` weighted by ``alpha [E, H]`` and filtered by ``value_filter [E, H, C]``."""
        out = x_j * alpha.unsqueeze(-1)
        return out if value_filter is None else out * value_filter
