"""PaiNN: polarizable atom interaction neural network (Schütt, Unke, Gastegger, ICML 2021).

Each node carries scalars ``s [N, H]`` and vectors ``v [N, 3, H]`` (``v`` starts at zero).
A layer is a message block (radial filters from a Bessel basis times a cosine cutoff gate
the neighbours' scalars, vectors and the edge direction) followed by the PaiNN update block.
Scalars are invariant and vectors equivariant under rotations, reflections, translations
and node permutations.
"""

from __future__ import annotations

import torch
from torch import nn

from ..encoder_configs.geometric import PAINNConfig
from ..nn import BesselRBF, CosineCutoff, EquivariantMessage, PaiNNUpdate, RadialEdges
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding, register_encoder
from .equivariant_utils import (
    AtomEmbedding,
    VectorReadout,
    call_layer,
    check_dims,
    edge_attributes,
    edge_geometry,
)


class PaiNNMessage(nn.Module):
    """The PaiNN message block plus update block of one layer.

    ``phi(s)`` then the :class:`~hydragnn.models.nn.EquivariantMessage` primitive (named
    ``filter``: it holds the radial filter's weights), residuals, then the update block.
    """

    def __init__(self, hidden: int, num_filter_in: int, eps: float) -> None:
        super().__init__()
        self.hidden = hidden
        self.phi = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 3 * hidden))
        self.filter = EquivariantMessage(num_filter_in, hidden)
        self.update = PaiNNUpdate(hidden, eps)

    def forward(self, s: torch.Tensor, v: torch.Tensor, edges: RadialEdges) -> tuple[torch.Tensor, torch.Tensor]:
        """``s [N, H]``, ``v [N, 3, H]``, edges with unit vectors -> updated ``(s, v)``."""
        ds, dv = self.filter(self.phi(s), v, edges)
        return self.update(s + ds, v + dv)


@register_encoder("PAINN")
class PAINN(Encoder):
    """PaiNN encoder: returns ``NodeEmbedding(scalar [N, H], vector [N, 3, C])``."""

    Config = PAINNConfig
    equivariant = True
    needs_pos = True

    def __init__(self, dims: EncoderDims, config: PAINNConfig | None = None) -> None:
        config = PAINNConfig() if config is None else config
        super().__init__(dims, config)
        check_dims(dims, "PAINN")
        hidden = dims.hidden_dim
        self.embedding = AtomEmbedding(dims)
        self.rbf = BesselRBF(dims.radius, dims.num_radial, trainable=config.trainable_rbf)
        self.cutoff = CosineCutoff(dims.radius)
        filter_in = dims.num_radial + max(dims.edge_in, 0)
        self.layers = nn.ModuleList(
            PaiNNMessage(hidden, filter_in, config.norm_eps) for _ in range(dims.num_conv_layers)
        )
        self.readout = VectorReadout(hidden, config.num_vector_channels)

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        length, unit = edge_geometry(inputs, "PAINN")
        s = self.embedding(inputs.x)
        length = length.to(s.dtype)
        unit = unit.to(s.dtype)
        edge_attr = edge_attributes(inputs, self.dims, "PAINN", s.dtype)
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        edges = RadialEdges(src, dst, length, s.shape[0], s.dtype, self.rbf, self.cutoff, unit=unit, attr=edge_attr)
        checkpointing = self.dims.conv_checkpointing and torch.is_grad_enabled()
        if checkpointing:
            edges.materialize()
        v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        for i, layer in enumerate(self.layers):
            s_in = s
            s, v = call_layer(layer, checkpointing, s, v, edges)
            s = self.mix(i, s_in, s, inputs)
        return NodeEmbedding(scalar=s, vector=self.readout(v))
