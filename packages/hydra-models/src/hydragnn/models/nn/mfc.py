"""MFC's smooth convolution on PyG's :class:`~torch_geometric.nn.conv.MFConv` (the MFC encoder:
:mod:`hydragnn.models.encoders.mfc`): gated messages, degree-specific weights interpolated over
the envelope-weighted degree (no ``nonzero()``: capture-safe)."""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch import Tensor, nn
from torch_geometric.nn.conv import MFConv

from .degree import smoothstep, soft_degree
from .scatter import Float32Aggregation


class SmoothMFConv(Float32Aggregation, MFConv):
    """:class:`MFConv` with gated messages and interpolation between degree-specific weights."""

    propagate_type = {"x": "Tensor", "gate": "Tensor"}
    degrees: Tensor

    def __init__(self, channels: int, edge_dim: int, max_degree: int) -> None:
        super().__init__(channels, channels, max_degree=max_degree)
        self.gate = nn.Linear(edge_dim, channels) if edge_dim > 0 else None
        self.register_buffer("degrees", torch.arange(max_degree + 1, dtype=torch.get_default_dtype()), persistent=False)

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        gate = env if self.gate is None else self.gate(edge_feat) * env
        h = self.propagate(edge_index, x=x, gate=gate)
        deg = soft_degree(env, edge_index[1], x.shape[0]).clamp(max=float(self.max_degree))  # [N, 1]
        weights = 1.0 - smoothstep((deg - self.degrees.to(deg.dtype)).abs())  # [N, K+1], rows sum to 1
        outs = torch.stack([lin_l(h) + lin_r(x) for lin_l, lin_r in zip(self.lins_l, self.lins_r)], dim=1)
        return (weights.unsqueeze(-1) * outs).sum(dim=1)

    def message(self, x_j: Tensor, gate: Tensor) -> Tensor:  # type: ignore[override]
        return x_j * gate
