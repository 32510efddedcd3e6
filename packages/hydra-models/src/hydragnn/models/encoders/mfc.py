"""MFC: molecular-fingerprint convolutions with degree-specific weights, made smooth and capture-safe.

``x_i' = sum_k w_k(d_i) (W^l_k h_i + W^r_k x_i)`` with ``h_i = sum_j g_ij * x_j`` (gate
``g_ij = env(r_ij) * W e_ij``) and weights ``w_k`` a C1 partition of unity over the
envelope-weighted degree ``d_i = sum_j env(r_ij)`` clamped to ``max_degree``. For an integer
degree this is PyG's :class:`~torch_geometric.nn.conv.MFConv` (whose ``lins_l``/``lins_r`` it
reuses); unlike it, there is no ``nonzero()`` (data-dependent shape) and the output changes
smoothly when a neighbour crosses the cutoff.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn.conv import MFConv

from ..encoder_configs.base import check_at_least
from ..encoder_configs.invariant import MFCConfig
from .base import EncoderDims, register_encoder
from .invariant_utils import (
    Float32Aggregation,
    InvariantEncoder,
    smoothstep,
    soft_degree,
)


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


@register_encoder("MFC")
class MFCEncoder(InvariantEncoder):
    """Stack of :class:`SmoothMFConv` (see the module docstring)."""

    Config = MFCConfig

    def make_conv(self, dims: EncoderDims, config: Config, edge_dim: int) -> nn.Module:
        check_at_least("max_degree", config.max_degree)
        return SmoothMFConv(dims.hidden_dim, edge_dim, config.max_degree)
