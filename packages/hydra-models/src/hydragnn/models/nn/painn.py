"""PaiNN's message and update operations (Schütt, Unke, Gastegger, ICML 2021).

:class:`EquivariantMessage` is the message block after ``phi``: radial filters from the basis
values gate the neighbours' scalars, vectors and the edge direction, summed into the targets.
:class:`PaiNNUpdate` mixes scalar and vector channels of each node. Both are equivariant
(weights act on channels only) and safe on zero-length padded edges (``unit`` is 0 there).
"""

from __future__ import annotations

import torch
from torch import nn

from .backends import Primitive
from .edges import RadialEdges
from .scatter import scatter_sum


def vector_norm(v: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(|v|^2 + eps)`` over the Cartesian axis: ``[N, 3, C] -> [N, C]`` (smooth at 0)."""
    return torch.sqrt((v * v).sum(dim=1) + eps)


class EquivariantMessage(Primitive, nn.Linear):
    """PaiNN's message block, aggregated: ``(sum_j ds_ji, sum_j dv_ji)`` per target node.

    ``x = phi[src] * (W basis_values + b) * env(r)`` split into ``(ds, g_vv, g_vs)``;
    ``dv = v[src] * g_vv + g_vs * unit``. An ``nn.Linear(num_filter_in, 3H)`` (the radial
    filter), so its state-dict keys are those of the linear layer it replaces.

    Shapes: ``phi [N, 3H]``, ``v [N, 3, H]``, ``edges.unit [E, 3]`` -> ``[N, H]``, ``[N, 3, H]``.
    """

    def __init__(self, num_filter_in: int, hidden: int) -> None:
        super().__init__(num_filter_in, 3 * hidden)
        self.hidden = hidden

    def forward(  # type: ignore[override]
        self, phi: torch.Tensor, v: torch.Tensor, edges: RadialEdges
    ) -> tuple[torch.Tensor, torch.Tensor]:
        src, unit = edges.src, edges.unit
        assert unit is not None  # PaiNN's edges carry their unit vectors
        x = phi.index_select(0, src) * nn.Linear.forward(self, edges.basis_values) * edges.envelope_values
        ds, g_vv, g_vs = torch.split(x, self.hidden, dim=-1)
        dv = v.index_select(0, src) * g_vv.unsqueeze(1) + g_vs.unsqueeze(1) * unit.unsqueeze(-1)
        return scatter_sum(ds, edges.dst, edges.num_nodes), scatter_sum(dv, edges.dst, edges.num_nodes)


class PaiNNUpdate(nn.Module):
    """The PaiNN update block: mixes scalar and vector channels of each node.

    ``v += a_vv * U v``; ``s += a_sv * <U v, V v> + a_ss`` with ``(a_vv, a_sv, a_ss)`` an MLP of
    ``[s, |V v|]``. Equivariant: U and V act on channels only (no bias).
    """

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.hidden = hidden
        self.eps = eps
        self.U = nn.Linear(hidden, hidden, bias=False)
        self.V = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, 3 * hidden))

    def forward(self, s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``s [N, H]``, ``v [N, 3, H]`` -> updated ``(s, v)``."""
        uv = self.U(v)
        vv = self.V(v)
        a = self.mlp(torch.cat([s, vector_norm(vv, self.eps)], dim=-1))
        a_vv, a_sv, a_ss = torch.split(a, self.hidden, dim=-1)
        v = v + a_vv.unsqueeze(1) * uv
        s = s + a_sv * (uv * vv).sum(dim=1) + a_ss
        return s, v
