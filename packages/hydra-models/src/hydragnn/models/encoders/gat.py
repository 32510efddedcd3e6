"""GAT: GATv2 attention convolutions with radial filters and an envelope-weighted softmax with a null key.

Attention logits are PyG's :class:`~torch_geometric.nn.conv.GATv2Conv` logits
``l_ij = a^T LeakyReLU(W_r x_i + W_l x_j + W_e e_ij)`` (``e_ij`` = radial basis of the distance
times the cutoff envelope, plus the schema's edge inputs). Per head, the weights are a softmax
over the neighbours and one null key of logit 0, each neighbour weighted by its envelope:

    ``alpha_ij = env_ij exp(l_ij) / (1 + sum_k env_ik exp(l_ik))``

and the message is the neighbour's value filtered by its distance,
``m_ij = alpha_ij * (W_l x_j) * (W_v e_ij)`` (a continuous filter as in SchNet), so

    ``x_i' = mean_heads sum_j m_ij + b``  (or the heads concatenated).

Why not PyG's plain softmax: it sums to one over the neighbours, so the layer sees a weighted
*average* and cannot tell a compressed neighbourhood from a stretched one, nor 12 neighbours from
18; the values were the same ``W_l x_j`` for every distance, and the energy under-fitted
(docs/notes/encoder_design.md). The null key ("softmax with an extra
zero logit") lets the total weight ``sum_j alpha_ij < 1`` grow with the number and closeness of
the neighbours, and the filter makes the values distance-aware.

Smoothness: a neighbour crossing the cutoff (``env -> 0``) leaves both the numerator and the
normaliser, so the energy is continuous. No self loops are added (PyG's self-loop handling
removes loops with a boolean mask, which is not capture-safe); the layer's own input reaches the
output through the residual connection. The softmax is shifted by the detached per-node maximum
logit (clamped at 0, the null key's logit) for stability; it cancels exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.conv import GATv2Conv
from torch_geometric.utils import scatter

from ..encoder_configs.base import check_at_least
from ..encoder_configs.invariant import WHERE, GATConfig
from ..errors import ModelConfigError
from ..nn.scatter import accumulate_dtype
from .base import EncoderDims, register_encoder
from .invariant_utils import Float32Aggregation, InvariantEncoder


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
        """Attention weights ``[E, H]`` (see the module docstring)."""
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


@register_encoder("GAT")
class GATEncoder(InvariantEncoder):
    """Stack of :class:`EnvelopeGATv2Conv` (see the module docstring)."""

    Config = GATConfig

    def make_conv(self, dims: EncoderDims, config: Config, edge_dim: int) -> nn.Module:
        check_at_least("heads", config.heads)
        if config.concat and dims.hidden_dim % config.heads:
            raise ModelConfigError(
                f"{WHERE}.heads: with concat=true hidden_dim ({dims.hidden_dim}) must be divisible by heads ({config.heads})"
            )
        if not 0.0 <= config.attention_dropout < 1.0:
            raise ModelConfigError(
                f"{WHERE}.attention_dropout: expected a value in [0, 1), found {config.attention_dropout}"
            )
        return EnvelopeGATv2Conv(
            dims.hidden_dim, edge_dim, config.heads, config.concat, config.negative_slope, config.attention_dropout
        )
