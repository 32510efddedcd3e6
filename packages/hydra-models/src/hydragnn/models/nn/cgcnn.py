"""CGCNN's envelope-weighted convolution with LayerNorms on PyG's :class:`~torch_geometric.nn.conv.CGConv`.

:class:`EnvelopeCGConv` is the convolution of the CGCNN encoder
(:mod:`hydragnn.models.encoders.cgcnn`, where the normalisation is described):
``x_i' = x_i + LN_a(sum_j env(r_ij) * sigmoid(LN_f(W_f z_ij)) * softplus(LN_s(W_s z_ij)))`` with
``z_ij = [x_i, x_j, e_ij]``. In bfloat16 the gather, the norms, the gate nonlinearities and the
sum over neighbours run in float32 (the linear maps stay in the model's dtype).
"""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.conv import CGConv

from .scatter import Float32Aggregation, accumulate_dtype


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """``norm(x)`` evaluated in ``x``'s dtype (the affine parameters are cast to it)."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight.to(x.dtype), norm.bias.to(x.dtype), norm.eps)


class EnvelopeCGConv(Float32Aggregation, CGConv):
    """:class:`CGConv` with envelope-weighted messages and LayerNorms (see :mod:`hydragnn.models.encoders.cgcnn`).

    Parameters beyond :class:`CGConv`'s: ``norm_f``, ``norm_s`` (LayerNorms of the gate
    pre-activations, ``[E, C]``) and ``norm_aggr`` (LayerNorm of the neighbour sum, ``[N, C]``).
    """

    propagate_type = {"x": "Tensor", "edge_attr": "OptTensor", "env": "Tensor"}

    def __init__(self, channels: int, edge_dim: int) -> None:
        super().__init__(channels, dim=edge_dim, aggr="add", batch_norm=False, bias=True)
        self.norm_f = nn.LayerNorm(channels)
        self.norm_s = nn.LayerNorm(channels)
        self.norm_aggr = nn.LayerNorm(channels)

    def forward(self, x: Tensor, edge_index: Tensor, edge_feat: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        """``x [N, C]``, ``edge_index [2, E]``, ``edge_feat [E, D]`` or None, ``env [E, 1]`` -> ``[N, C]``."""
        out = self.propagate(edge_index, x=x.to(accumulate_dtype(x.dtype)), edge_attr=edge_feat, env=env)
        return (x.to(out.dtype) + _layer_norm(self.norm_aggr, out)).to(x.dtype)

    def message(self, x_i: Tensor, x_j: Tensor, edge_attr: Tensor | None, env: Tensor) -> Tensor:  # type: ignore[override]
        dt = self.lin_f.weight.dtype
        x_i, x_j = x_i.to(dt), x_j.to(dt)
        z = torch.cat([x_i, x_j] if edge_attr is None else [x_i, x_j, edge_attr], dim=-1)
        acc = accumulate_dtype(z.dtype)
        gate = _layer_norm(self.norm_f, self.lin_f(z).to(acc)).sigmoid()
        core = F.softplus(_layer_norm(self.norm_s, self.lin_s(z).to(acc)))
        return gate * core * env.to(acc)
