"""EGNN: E(n)-equivariant graph neural network (Satorras, Hoogeboom, Welling, ICML 2021).

Equivariant graph convolutional layers (E_GCL) update invariant node features ``h`` from
messages ``m_ij = phi_e(h_i, h_j, |x_i - x_j|^2, a_ij)`` and an equivariant vector channel
``v_i += sum_j (x_i - x_j) phi_x(m_ij)``. The input positions are never moved (forces stay
``-dE/dpos``): the coordinate update of the paper is carried in ``v`` as an accumulated
displacement (channel 0), and with ``update_coords`` the next layer's distances are those of
the displaced coordinates, ``x_j - x_i = edge_vec_ij + v_j[:, 0] - v_i[:, 0]`` (``edge_vec``
already holds periodic shifts; positions are never differenced directly). When nothing reads
``v`` (no ``update_coords``, and the model says no later stage reads an encoder's vectors:
``EncoderDims.vector_output``), it is neither built nor computed: the layers have no
coordinate MLP and the encoder returns ``vector=None``.

Messages are gated by a cosine cutoff of the input distance, so energies are smooth when a
neighbour crosses the radius, and sums are divided by the constant ``avg_num_neighbors`` (the
training set's mean in-degree unless the config gives it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..encoder_configs.geometric import EGNN_DEFAULT_AVG_NUM_NEIGHBORS, EGNNConfig
from ..nn.scatter import scatter_sum
from .base import EncoderDims, GraphInputs, NodeEmbedding, register_encoder
from .equivariant_utils import EquivariantEncoder
from .graph_statistics import avg_num_neighbors_statistics


class EGCL(nn.Module):
    """One E(n)-equivariant convolution layer acting on ``h [N, H]`` and, when ``vectors``,
    ``v [N, 3, C]`` (else ``v`` is None and stays None)."""

    def __init__(
        self, hidden: int, edge_feat: int, channels: int, config: EGNNConfig, radius: float, vectors: bool
    ) -> None:
        super().__init__()
        self.update_coords = config.update_coords
        self.inv_norm = 1.0 / (config.avg_num_neighbors or EGNN_DEFAULT_AVG_NUM_NEIGHBORS)
        self.inv_r2 = 1.0 / radius**2
        self.edge_mlp = nn.Sequential(
            nn.Linear(2 * hidden + 1 + edge_feat, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU()
        )
        self.att = nn.Sequential(nn.Linear(hidden, 1), nn.Sigmoid()) if config.attention else None
        self.node_mlp = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.coord_mlp: nn.Module | None = None
        if vectors:
            last = nn.Linear(hidden, channels, bias=False)
            if config.update_coords:  # small initial displacements (the paper's gain 0.001); other channels default
                with torch.no_grad():
                    last.weight[0].mul_(1e-3)
            self.coord_mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), last)

    def forward(
        self,
        h: torch.Tensor,
        v: torch.Tensor | None,
        edge_index: torch.Tensor,
        edge_vec: torch.Tensor,
        edge_feat: torch.Tensor,
        fcut: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``h [N,H]``, ``v [N,3,C]`` or None, ``edge_vec [E,3]`` (x_j - x_i), ``edge_feat [E,R(+Fe)]``
        (without ``update_coords`` already led by the scaled squared distance ``d2 [E, 1]``, which is
        then the same in every layer), ``fcut [E, 1]``."""
        src, dst = edge_index[0], edge_index[1]
        num_nodes = h.shape[0]
        parts = [h.index_select(0, dst), h.index_select(0, src)]
        if self.update_coords:
            assert v is not None  # update_coords always builds the vectors (see EGNN.__init__)
            rel = edge_vec + (v[:, :, 0].index_select(0, src) - v[:, :, 0].index_select(0, dst))
            parts.append(squared_distance(rel, self.inv_r2))
        else:
            rel = edge_vec
        m = self.edge_mlp(torch.cat([*parts, edge_feat], dim=-1))
        if self.att is not None:
            m = m * self.att(m)
        m = m * fcut
        agg = scatter_sum(m, dst, num_nodes)
        if self.inv_norm != 1.0:
            agg = agg * self.inv_norm
        h = h + self.node_mlp(torch.cat([h, agg], dim=-1))
        if v is None or self.coord_mlp is None:  # built together: no vectors, no coordinate MLP
            return h, v
        dv = -rel.unsqueeze(-1) * (self.coord_mlp(m) * fcut).unsqueeze(1)  # (x_i - x_j) phi_x(m_ij)
        dv = scatter_sum(dv, dst, num_nodes)
        v = v + (dv * self.inv_norm if self.inv_norm != 1.0 else dv)
        return h, v


def squared_distance(rel: torch.Tensor, inv_r2: float) -> torch.Tensor:
    """``|rel|^2 / r_c^2``: ``[E, 3] -> [E, 1]``."""
    return (rel * rel).sum(dim=-1, keepdim=True) * inv_r2


@register_encoder("EGNN")
class EGNN(EquivariantEncoder[EGNNConfig]):
    """EGNN encoder: returns ``NodeEmbedding(scalar h [N, H], vector [N, 3, C])`` (``vector``
    None when nothing reads it, see the module docstring)."""

    Config = EGNNConfig
    config: EGNNConfig

    @classmethod
    def data_statistics(cls, config: EGNNConfig, trainset: Sequence[Any]) -> dict[str, Any]:
        """``avg_num_neighbors``: the training set's mean in-degree, when the config leaves it unset."""
        return avg_num_neighbors_statistics(config.avg_num_neighbors is None, trainset)

    def __init__(self, dims: EncoderDims, config: EGNNConfig | None = None) -> None:
        super().__init__(dims, config)
        config = self.config
        channels = config.num_vector_channels or dims.hidden_dim
        edge_feat = dims.num_radial + max(dims.edge_in, 0)
        self.tracks_vectors = config.update_coords or dims.vector_output
        self.update_coords = config.update_coords
        self.layers = nn.ModuleList(
            EGCL(dims.hidden_dim, edge_feat, channels, config, dims.radius, self.tracks_vectors)
            for _ in range(dims.num_conv_layers)
        )
        self.channels = channels

    @property
    def vector_channels(self) -> int:
        return self.channels if self.tracks_vectors else 0

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """Artifacts written before the layers dropped their unread coordinate MLP still load:
        those weights are skipped."""
        if not self.tracks_vectors:
            for key in [k for k in state_dict if k.startswith(prefix + "layers.") and ".coord_mlp." in k]:
                del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        h, length, _, edge_attr = self.edge_inputs(inputs)
        assert inputs.edge_vec is not None
        edge_vec = inputs.edge_vec.to(h.dtype)
        edge_feat = self.rbf(length)
        if edge_attr is not None:
            edge_feat = torch.cat([edge_feat, edge_attr], dim=-1)
        fcut = self.cutoff(length).unsqueeze(-1)
        if not self.update_coords:  # every layer reads the input distances: computed once
            edge_feat = torch.cat([squared_distance(edge_vec, 1.0 / self.dims.radius**2), edge_feat], dim=-1)
        v = h.new_zeros((h.shape[0], 3, self.channels)) if self.tracks_vectors else None
        args = (inputs.edge_index, edge_vec, edge_feat, fcut)
        h, v = self.run_layers(h, v, inputs, self.dims.conv_checkpointing, *args)
        return NodeEmbedding(scalar=h, vector=v)
