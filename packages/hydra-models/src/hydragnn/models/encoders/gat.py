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

from torch import nn

from ..encoder_configs.base import check_at_least
from ..encoder_configs.invariant import WHERE, GATConfig
from ..errors import ModelConfigError
from ..nn.gat import EnvelopeGATv2Conv
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder


@register_encoder("GAT")
class GATEncoder(InvariantEncoder[GATConfig]):
    """Stack of :class:`EnvelopeGATv2Conv` (see the module docstring)."""

    Config = GATConfig

    def make_conv(self, dims: EncoderDims, config: GATConfig, edge_dim: int) -> nn.Module:
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
