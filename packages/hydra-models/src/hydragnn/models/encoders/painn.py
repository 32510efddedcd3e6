"""PaiNN: polarizable atom interaction neural network (Schütt, Unke, Gastegger, ICML 2021).

Each node carries scalars ``s [N, H]`` and vectors ``v [N, 3, H]`` (``v`` starts at zero).
A layer is a message block (radial filters from a Bessel basis times a cosine cutoff gate
the neighbours' scalars, vectors and the edge direction) followed by the PaiNN update block.
Scalars are invariant and vectors equivariant under rotations, reflections, translations
and node permutations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..encoder_configs.geometric import PAINNConfig
from ..nn import EquivariantMessage, PaiNNUpdate, RadialEdges
from .base import EncoderDims, GraphInputs, NodeEmbedding, register_encoder
from .equivariant_utils import EquivariantEncoder, VectorReadout
from .graph_statistics import avg_num_neighbors_statistics


class PaiNNMessage(nn.Module):
    """The PaiNN message block plus update block of one layer.

    ``phi(s)`` then the :class:`~hydragnn.models.nn.EquivariantMessage` primitive (named
    ``filter``: it holds the radial filter's weights), residuals, then the update block.
    """

    def __init__(
        self, hidden: int, num_filter_in: int, eps: float, radial_mlp: int | None = None, inv_norm: float | None = None
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.inv_norm = inv_norm
        self.phi = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 3 * hidden))
        self.radial: nn.Sequential | None = None
        if radial_mlp is not None:
            self.radial = nn.Sequential(
                nn.Linear(num_filter_in, radial_mlp), nn.SiLU(), nn.Linear(radial_mlp, radial_mlp), nn.SiLU()
            )
            num_filter_in = radial_mlp
        self.filter = EquivariantMessage(num_filter_in, hidden)
        self.update = PaiNNUpdate(hidden, eps)

    def forward(self, s: torch.Tensor, v: torch.Tensor, edges: RadialEdges) -> tuple[torch.Tensor, torch.Tensor]:
        """``s [N, H]``, ``v [N, 3, H]``, edges with unit vectors -> updated ``(s, v)``; with a
        radial MLP the filter reads ``radial(basis_values) [E, m]``."""
        if self.radial is not None:
            edges = edges.with_basis_values(self.radial(edges.basis_values))
        ds, dv = self.filter(self.phi(s), v, edges)
        if self.inv_norm is not None:
            ds, dv = ds * self.inv_norm, dv * self.inv_norm
        return self.update(s + ds, v + dv)


@register_encoder("PAINN")
class PAINN(EquivariantEncoder[PAINNConfig]):
    """PaiNN encoder: returns ``NodeEmbedding(scalar [N, H], vector [N, 3, C])``."""

    Config = PAINNConfig
    config: PAINNConfig

    @classmethod
    def data_statistics(cls, config: PAINNConfig, trainset: Sequence[Any]) -> dict[str, Any]:
        """``avg_num_neighbors``: the training set's mean in-degree where the config says ``"auto"``."""
        return avg_num_neighbors_statistics(config.avg_num_neighbors == "auto", trainset)

    def __init__(self, dims: EncoderDims, config: PAINNConfig | None = None) -> None:
        super().__init__(dims, config)
        filter_in = dims.num_radial + max(dims.edge_in, 0)
        avg = self.config.avg_num_neighbors
        inv_norm = 1.0 / avg if isinstance(avg, (int, float)) else None  # None / "auto" unfilled: plain sums
        self.layers = nn.ModuleList(
            PaiNNMessage(dims.hidden_dim, filter_in, self.config.norm_eps, self.config.radial_mlp, inv_norm)
            for _ in range(dims.num_conv_layers)
        )
        self.readout = VectorReadout(dims.hidden_dim, self.config.num_vector_channels)

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        s, length, unit, edge_attr = self.edge_inputs(inputs)
        src, dst = inputs.edge_index[0], inputs.edge_index[1]
        edges = RadialEdges(src, dst, length, s.shape[0], s.dtype, self.rbf, self.cutoff, unit=unit, attr=edge_attr)
        checkpointing = self.dims.conv_checkpointing and torch.is_grad_enabled()
        if checkpointing:
            edges.materialize()
        v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        s, v = self.run_layers(s, v, inputs, checkpointing, edges)
        return NodeEmbedding(scalar=s, vector=self.readout(v))
