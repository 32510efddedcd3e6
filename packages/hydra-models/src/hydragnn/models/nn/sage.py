"""SAGE's gated convolution on PyG's :class:`~torch_geometric.nn.conv.SAGEConv` (the SAGE encoder:
:mod:`hydragnn.models.encoders.sage`): gated messages, a smooth degree normalisation."""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

from torch import Tensor, nn
from torch_geometric.nn.conv import SAGEConv

from .degree import soft_degree
from .scatter import Float32Aggregation, smooth_count


class GatedSAGEConv(Float32Aggregation, SAGEConv):
    """:class:`SAGEConv` with gated messages and a smooth degree normalisation."""

    propagate_type = {"x": "Tensor", "gate": "Tensor"}

    def __init__(self, channels: int, edge_dim: int) -> None:
        super().__init__(channels, channels, aggr="sum", root_weight=True, normalize=False, project=False)
        self.gate = nn.Linear(edge_dim, channels) if edge_dim > 0 else None

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        gate = env if self.gate is None else self.gate(edge_feat) * env
        out = self.propagate(edge_index, x=x, gate=gate)
        out = out / smooth_count(soft_degree(env, edge_index[1], x.shape[0]))
        return self.lin_l(out) + self.lin_r(x)

    def message(self, x_j: Tensor, gate: Tensor) -> Tensor:  # type: ignore[override]
        return x_j * gate
