"""GAT: GATv2 attention convolutions with radial-basis edge features and an envelope-weighted softmax.

Attention logits are PyG's :class:`~torch_geometric.nn.conv.GATv2Conv` logits
``a^T LeakyReLU(W_r x_i + W_l x_j + W_e e_ij)``; the weights are

    ``alpha_ij = env_ij * [exp(l_ij) env_ij / sum_k exp(l_ik) env_ik]``

i.e. the softmax of ``l_ij + log env_ij``, multiplied by the envelope after the softmax. A
neighbour crossing the cutoff (``env -> 0``) then enters neither the numerator nor the
normaliser, so the energy stays continuous. No self loops are added (PyG's self-loop handling
removes loops with a boolean mask, which is not capture-safe); the layer's own input reaches the
output through the residual connection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.conv import GATv2Conv
from torch_geometric.utils import softmax

from ..errors import ModelConfigError
from .base import EncoderDims, register_encoder
from .invariant_utils import (
    WHERE,
    Float32Aggregation,
    InvariantConfig,
    InvariantEncoder,
    accumulate_dtype,
    check_positive,
)


class EnvelopeGATv2Conv(Float32Aggregation, GATv2Conv):
    """:class:`GATv2Conv` whose attention is weighted by the cutoff envelope.

    The envelope travels as the last column of ``edge_attr`` (``[E, edge_dim + 1]``): it is split
    off in :meth:`edge_update` before the edge features enter the logits.
    """

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

    def edge_update(  # type: ignore[override]
        self,
        x_j: Tensor,
        x_i: Tensor,
        edge_attr: Tensor | None,
        index: Tensor,
        ptr: Tensor | None,
        dim_size: int | None,
    ) -> Tensor:
        assert edge_attr is not None, "EnvelopeGATv2Conv expects the envelope as the last edge_attr column"
        env = edge_attr[:, -1:]  # [E, 1]
        x = x_i + x_j
        if self.lin_edge is not None:
            x = x + self.lin_edge(edge_attr[:, :-1]).view(-1, self.heads, self.out_channels)
        x = F.leaky_relu(x, self.negative_slope)
        logits = (x * self.att).sum(dim=-1)  # [E, H]
        acc = accumulate_dtype(logits.dtype)  # softmax of 16-bit logits in float32
        env = env.to(acc)
        logits = logits.to(acc) + torch.log(env.clamp(min=torch.finfo(acc).tiny))
        alpha = (softmax(logits, index, ptr, dim_size) * env).to(x.dtype)
        return F.dropout(alpha, p=self.dropout, training=self.training)


@register_encoder("GAT")
class GATEncoder(InvariantEncoder):
    """Stack of :class:`EnvelopeGATv2Conv` (see the module docstring)."""

    @dataclass(frozen=True)
    class Config(InvariantConfig):
        """GAT keys.

        Attributes:
            heads: attention heads.
            concat: concatenate heads of width ``hidden_dim // heads`` (needs ``hidden_dim``
                divisible by ``heads``); else average heads of width ``hidden_dim``.
            negative_slope: LeakyReLU slope inside the attention logits.
            attention_dropout: dropout on the attention weights (training only).
        """

        heads: int = 4
        concat: bool = False
        negative_slope: float = 0.2
        attention_dropout: float = 0.0

    def make_conv(self, dims: EncoderDims, config: Config, edge_dim: int) -> nn.Module:
        check_positive("heads", config.heads)
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

    def apply_conv(
        self, conv: nn.Module, h: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor
    ) -> Tensor:
        packed = env if edge_feat is None else torch.cat([edge_feat, env], dim=-1)
        return conv(h, edge_index, edge_attr=packed)
