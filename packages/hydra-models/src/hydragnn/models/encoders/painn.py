"""PaiNN: polarizable atom interaction neural network (Schütt, Unke, Gastegger, ICML 2021).

Each node carries scalars ``s [N, H]`` and vectors ``v [N, 3, H]`` (``v`` starts at zero).
A layer is a message block (radial filters from a Bessel basis times a cosine cutoff gate
the neighbours' scalars, vectors and the edge direction) followed by the PaiNN update block.
Scalars are invariant and vectors equivariant under rotations, reflections, translations
and node permutations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import Encoder, EncoderConfig, EncoderDims, GraphInputs, NodeEmbedding, register_encoder
from .basis import BesselRBF, CosineCutoff
from .equivariant_utils import (
    AtomEmbedding,
    PaiNNUpdate,
    VectorReadout,
    call_layer,
    check_dims,
    check_positive,
    edge_attributes,
    edge_geometry,
    scatter_sum,
)


@dataclass(frozen=True)
class PAINNConfig(EncoderConfig):
    """PAINN-specific keys of ``NeuralNetwork.Architecture``.

    Attributes:
        num_vector_channels: channels C of the returned vectors ``[N, 3, C]``; ``None`` keeps
            ``hidden_dim`` (no projection), another value adds a bias-free channel projection.
        trainable_rbf: learn the Bessel frequencies.
        norm_eps: ``eps`` in the smooth vector norm ``sqrt(|V v|^2 + eps)`` of the update block.
            Vectors vanish at inversion-symmetric sites (most crystal sites), where the norm is
            a smoothed ``|x|`` of width ``sqrt(eps)``: PaiNN's 1e-8 puts a near-cusp in the
            energy there (forces jump over ~1e-4 Å, huge Hessians); 1e-2 keeps it smooth.
    """

    num_vector_channels: int | None = None
    trainable_rbf: bool = False
    norm_eps: float = 1e-2

    def __post_init__(self) -> None:
        check_positive(self.num_vector_channels, "num_vector_channels")
        check_positive(self.norm_eps, "norm_eps", allow_none=False)


class PaiNNMessage(nn.Module):
    """The PaiNN message block plus update block of one layer."""

    def __init__(self, hidden: int, num_filter_in: int, eps: float) -> None:
        super().__init__()
        self.hidden = hidden
        self.phi = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 3 * hidden))
        self.filter = nn.Linear(num_filter_in, 3 * hidden)
        self.update = PaiNNUpdate(hidden, eps)

    def forward(
        self,
        s: torch.Tensor,
        v: torch.Tensor,
        edge_index: torch.Tensor,
        edge_feat: torch.Tensor,
        fcut: torch.Tensor,
        unit: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``s [N,H]``, ``v [N,3,H]``, edges ``[2,E]``, ``edge_feat [E,R(+Fe)]``, ``fcut [E]``, ``unit [E,3]``."""
        src, dst = edge_index[0], edge_index[1]
        num_nodes = s.shape[0]
        x = self.phi(s)[src] * self.filter(edge_feat) * fcut.unsqueeze(-1)
        ds, g_vv, g_vs = torch.split(x, self.hidden, dim=-1)
        dv = v[src] * g_vv.unsqueeze(1) + g_vs.unsqueeze(1) * unit.unsqueeze(-1)
        s = s + scatter_sum(ds, dst, num_nodes)
        v = v + scatter_sum(dv, dst, num_nodes)
        return self.update(s, v)


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
        edge_feat = self.rbf(length)
        edge_attr = edge_attributes(inputs, self.dims, "PAINN", s.dtype)
        if edge_attr is not None:
            edge_feat = torch.cat([edge_feat, edge_attr], dim=-1)
        fcut = self.cutoff(length)
        v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        for i, layer in enumerate(self.layers):
            s_in = s
            s, v = call_layer(layer, self.dims.conv_checkpointing, s, v, inputs.edge_index, edge_feat, fcut, unit)
            s = self.mix(i, s_in, s, inputs)
        return NodeEmbedding(scalar=s, vector=self.readout(v))
