"""CGCNN: crystal graph convolutions on radial-basis edge features.

``x_i' = x_i + sum_j env(r_ij) * sigmoid(W_f z_ij + b_f) * softplus(W_s z_ij + b_s)``,
``z_ij = [x_i, x_j, e_ij]``: PyG's :class:`~torch_geometric.nn.conv.CGConv` (no batch norm,
which would normalise over the whole padded batch) with messages weighted by the cutoff
envelope so that they vanish smoothly at the radius. Nodes are first embedded to
``hidden_dim``, which every layer keeps. In bfloat16 the gather, the gate nonlinearities and
the sum over neighbours run in float32 (the linear maps stay in the model's dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.conv import CGConv

from .base import EncoderDims, register_encoder
from .invariant_utils import Float32Aggregation, InvariantConfig, InvariantEncoder, accumulate_dtype


class EnvelopeCGConv(Float32Aggregation, CGConv):
    """:class:`CGConv` whose messages are multiplied by the cutoff envelope (float32 message math)."""

    propagate_type = {"x": "Tensor", "edge_attr": "OptTensor", "env": "Tensor"}

    def __init__(self, channels: int, edge_dim: int) -> None:
        super().__init__(channels, dim=edge_dim, aggr="add", batch_norm=False, bias=True)

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        out = self.propagate(edge_index, x=x.to(accumulate_dtype(x.dtype)), edge_attr=edge_feat, env=env)
        return (x.to(out.dtype) + out).to(x.dtype)

    def message(self, x_i: Tensor, x_j: Tensor, edge_attr: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        dt = self.lin_f.weight.dtype
        x_i, x_j = x_i.to(dt), x_j.to(dt)
        z = torch.cat([x_i, x_j] if edge_attr is None else [x_i, x_j, edge_attr], dim=-1)
        acc = accumulate_dtype(z.dtype)
        return self.lin_f(z).to(acc).sigmoid() * F.softplus(self.lin_s(z).to(acc)) * env.to(acc)


@register_encoder("CGCNN")
class CGCNNEncoder(InvariantEncoder):
    """Stack of :class:`EnvelopeCGConv`, each followed by the activation.

    ``residual`` defaults to False here: the convolution already adds its input.
    """

    @dataclass(frozen=True)
    class Config(InvariantConfig):
        """CGCNN has only the common invariant keys (``residual`` defaults to False)."""

        residual: bool = False

    def make_conv(self, dims: EncoderDims, config: Config, edge_dim: int) -> nn.Module:
        return EnvelopeCGConv(dims.hidden_dim, edge_dim)
