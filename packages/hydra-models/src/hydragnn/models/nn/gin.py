"""GIN's radially gated convolution on PyG's :class:`~torch_geometric.nn.conv.GINConv`.

:class:`GatedGINConv` is the convolution of the GIN encoder (:mod:`hydragnn.models.encoders.gin`):
``x_i' = MLP((1 + eps) x_i + sum_j g_ij * x_j)`` with the per-edge, per-channel gate
``g_ij = env(r_ij) * W e_ij`` (or the envelope alone without edge features), aggregated in
float32 when the model runs in bfloat16.
"""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

from torch import Tensor, nn
from torch_geometric.nn.conv import GINConv

from .activations import make_activation
from .scatter import Float32Aggregation


class GatedGINConv(Float32Aggregation, GINConv):
    """:class:`GINConv` whose messages ``x_j`` are multiplied by a per-edge, per-channel gate."""

    propagate_type = {"x": "Tensor", "gate": "Tensor"}

    def __init__(self, channels: int, edge_dim: int, activation: str, eps: float, train_eps: bool) -> None:
        mlp = nn.Sequential(nn.Linear(channels, channels), make_activation(activation), nn.Linear(channels, channels))
        super().__init__(mlp, eps=eps, train_eps=train_eps)
        self.gate = nn.Linear(edge_dim, channels) if edge_dim > 0 else None

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        gate = env if self.gate is None else self.gate(edge_feat) * env
        out = self.propagate(edge_index, x=x, gate=gate)
        return self.nn(out + (1.0 + self.eps) * x)

    def message(self, x_j: Tensor, gate: Tensor) -> Tensor:  # type: ignore[override]
        return x_j * gate
