"""CGCNN: crystal graph convolutions on radial-basis edge features, with LayerNorm for BatchNorm.

``x_i' = x_i + LN_a(sum_j env(r_ij) * sigmoid(LN_f(W_f z_ij)) * softplus(LN_s(W_s z_ij)))``,
``z_ij = [x_i, x_j, e_ij]``: PyG's :class:`~torch_geometric.nn.conv.CGConv` with messages weighted
by the cutoff envelope so that they vanish smoothly at the radius. Nodes are first embedded to
``hidden_dim``, which every layer keeps.

Normalisation: the original CGCNN (Xie & Grossman 2018) batch-normalises the gate
pre-activations ``W z`` of every edge and the neighbour sum of every node. Batch statistics
would couple the graphs of a batch (a padded batch or a batch of one would give other results),
so both are replaced by per-row LayerNorms: ``LN_f`` / ``LN_s`` over the channels of each edge's
gate pre-activations and ``LN_a`` over the channels of each node's sum. Without them the sum of
strictly positive messages grows layer by layer, the gates saturate and the model under-fits
(docs/notes/encoder_design.md). ``LN_a`` makes a node's update independent of the overall scale of its sum; for an atom whose
only neighbour approaches the cutoff the sum fades to zero continuously, but the update only
fades once the sum's channel variance falls below LayerNorm's ``eps`` (continuous, steeper).

Defaults: the Bessel radial basis (``radial_basis="bessel"``) with the cosine cutoff, which
learned best of the bases and envelopes tried (docs/notes/encoder_design.md).

In bfloat16 the gather, the norms, the gate nonlinearities and the sum over neighbours run in
float32 (the linear maps stay in the model's dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.conv import CGConv

from ..encoder_configs.invariant import CGCNNConfig
from ..nn.scatter import accumulate_dtype
from .base import EncoderDims, register_encoder
from .invariant_utils import Float32Aggregation, InvariantEncoder


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """``norm(x)`` evaluated in ``x``'s dtype (the affine parameters are cast to it)."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight.to(x.dtype), norm.bias.to(x.dtype), norm.eps)


class EnvelopeCGConv(Float32Aggregation, CGConv):
    """:class:`CGConv` with envelope-weighted messages and LayerNorms (see the module docstring).

    Parameters beyond :class:`CGConv`'s: ``norm_f``, ``norm_s`` (LayerNorms of the gate
    pre-activations, ``[E, C]``) and ``norm_aggr`` (LayerNorm of the neighbour sum, ``[N, C]``).
    """

    propagate_type = {"x": "Tensor", "edge_attr": "OptTensor", "env": "Tensor"}

    def __init__(self, channels: int, edge_dim: int) -> None:
        super().__init__(channels, dim=edge_dim, aggr="add", batch_norm=False, bias=True)
        self.norm_f = nn.LayerNorm(channels)
        self.norm_s = nn.LayerNorm(channels)
        self.norm_aggr = nn.LayerNorm(channels)

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        out = self.propagate(edge_index, x=x.to(accumulate_dtype(x.dtype)), edge_attr=edge_feat, env=env)
        return (x.to(out.dtype) + _layer_norm(self.norm_aggr, out)).to(x.dtype)

    def message(self, x_i: Tensor, x_j: Tensor, edge_attr: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        dt = self.lin_f.weight.dtype
        x_i, x_j = x_i.to(dt), x_j.to(dt)
        z = torch.cat([x_i, x_j] if edge_attr is None else [x_i, x_j, edge_attr], dim=-1)
        acc = accumulate_dtype(z.dtype)
        gate = _layer_norm(self.norm_f, self.lin_f(z).to(acc)).sigmoid()
        core = F.softplus(_layer_norm(self.norm_s, self.lin_s(z).to(acc)))
        return gate * core * env.to(acc)


@register_encoder("CGCNN")
class CGCNNEncoder(InvariantEncoder):
    """Stack of :class:`EnvelopeCGConv`, each followed by the activation.

    ``residual`` defaults to False here: the convolution already adds its input.
    """

    Config = CGCNNConfig

    def make_conv(self, dims: EncoderDims, config: Config, edge_dim: int) -> nn.Module:
        return EnvelopeCGConv(dims.hidden_dim, edge_dim)
