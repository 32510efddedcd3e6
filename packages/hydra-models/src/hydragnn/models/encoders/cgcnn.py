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

from torch import nn

from ..encoder_configs.invariant import CGCNNConfig
from ..nn.cgcnn import EnvelopeCGConv
from .base import EncoderDims, register_encoder
from .invariant_utils import InvariantEncoder


@register_encoder("CGCNN")
class CGCNNEncoder(InvariantEncoder[CGCNNConfig]):
    """Stack of :class:`EnvelopeCGConv`, each followed by the activation.

    ``residual`` defaults to False here: the convolution already adds its input.
    """

    Config = CGCNNConfig

    def make_conv(self, dims: EncoderDims, config: CGCNNConfig, edge_dim: int) -> nn.Module:
        return EnvelopeCGConv(dims.hidden_dim, edge_dim)
