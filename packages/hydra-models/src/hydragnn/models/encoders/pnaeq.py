"""PNAEq: HydraGNN's equivariant PNA (principal neighbourhood aggregation + PaiNN vectors).

Scalar messages are built from both end nodes and a radial embedding, then aggregated with
several aggregators (mean, min, max, std, sum) times degree scalers (identity,
amplification, attenuation, linear, inverse_linear), as in PNA (Corso et al. 2020); vector
messages and the update block are PaiNN's (Schütt et al. 2021).

Differences from count-based PNA, chosen so that energies and forces are smooth:

* every message is gated by a cosine cutoff, and degrees are *cutoff-weighted*
  (``deg_i = sum_j fcut(r_ij)``), so nothing jumps when a neighbour crosses the radius;
* mean and std are the fcut-weighted statistics normalised by ``max(deg_i, 1)``, std is
  ``sqrt(var + std_eps)``;
* min and max include 0 (``max(0, max_j m_ij)``): a neighbour entering at the cutoff has a
  zero message and leaves them unchanged. By default they are *soft*: a cutoff-weighted
  softmax ``sum_j fc_j e^{b m_j} m_j / (1 + sum_j fc_j e^{b m_j})`` (``b = +-minmax_beta``,
  the 1 being the included zero), smooth everywhere. Hard max/min are non-differentiable at
  ties, and crystals are full of exact ties (symmetry-equivalent neighbours): forces and
  stress by autograd then disagree with finite differences and between a cell and its
  supercell. ``smooth_minmax=False`` restores HydraGNN's hard aggregators;
* the scalers' averages are config constants (``avg_deg_lin``, ``avg_deg_log``), not a
  histogram of the training data, so the forward pass is data-independent.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..encoder_configs.geometric import PNAEQ_AGGREGATORS as AGGREGATORS  # noqa: F401  (re-exported)
from ..encoder_configs.geometric import PNAEQ_SCALERS as SCALERS  # noqa: F401  (re-exported)
from ..encoder_configs.geometric import PNAEqConfig
from ..nn.painn import PaiNNUpdate
from ..nn.scatter import scatter_sum
from .base import EncoderDims, GraphInputs, NodeEmbedding, register_encoder
from .equivariant_utils import EquivariantEncoder, VectorReadout


def soft_extreme(
    msg: torch.Tensor, weight: torch.Tensor, index: torch.Tensor, num_nodes: int, beta: float
) -> torch.Tensor:
    """Smooth ``max(0, max_j m_ij)`` (``beta > 0``) or ``min(0, min_j m_ij)`` (``beta < 0``) -> ``[N, H]``.

    ``sum_j w_j e^{beta m_j} m_j / (1 + sum_j w_j e^{beta m_j})`` with the cutoff weights ``w``,
    evaluated as ``e_j = exp(beta m_j + log w_j - s_i)`` with a detached per-node shift
    ``s_i = max(0, max_j beta m_j + log w_j)``: every exponent is ``<= 0`` and the denominator
    ``>= 1`` (the value, hence the gradient, does not depend on the shift). A zero weight
    (an edge at the cutoff) gives ``log w = -inf``, a zero term and zero (not NaN) gradients.
    """
    positive = weight > 0
    log_w = torch.where(positive, torch.log(torch.where(positive, weight, torch.ones_like(weight))), -math.inf)
    z = beta * msg + log_w.unsqueeze(-1)
    shift = msg.new_zeros((num_nodes, msg.shape[1])).scatter_reduce(
        0, index.unsqueeze(-1).expand_as(msg), z.detach(), reduce="amax", include_self=True
    )
    e = torch.exp(z - shift.index_select(0, index))
    num = scatter_sum(e * msg, index, num_nodes)
    den = torch.exp(-shift) + scatter_sum(e, index, num_nodes)
    return num / den


def pna_aggregate(
    msg: torch.Tensor,
    weight: torch.Tensor,
    index: torch.Tensor,
    num_nodes: int,
    config: PNAEqConfig,
) -> torch.Tensor:
    """Cutoff-weighted PNA aggregation of ``msg [E, H]`` at ``index [E]`` -> ``[N, A*S*H]``."""
    deg = scatter_sum(weight, index, num_nodes).clamp(min=1.0).unsqueeze(-1)
    wmsg = msg * weight.unsqueeze(-1)
    mean = scatter_sum(wmsg, index, num_nodes) / deg
    expanded = index.unsqueeze(-1).expand_as(msg)
    outs = []
    for name in config.aggregators:
        if name == "mean":
            outs.append(mean)
        elif name == "sum":
            outs.append(scatter_sum(wmsg, index, num_nodes))
        elif name in ("min", "max") and config.smooth_minmax:
            beta = config.minmax_beta if name == "max" else -config.minmax_beta
            outs.append(soft_extreme(msg, weight, index, num_nodes, beta))
        elif name in ("min", "max"):
            init = msg.new_zeros((num_nodes, msg.shape[1]))
            reduce = "amax" if name == "max" else "amin"
            outs.append(init.scatter_reduce(0, expanded, msg, reduce=reduce, include_self=True))
        else:  # std
            mean_sq = scatter_sum(wmsg * msg, index, num_nodes) / deg
            var = (mean_sq - mean * mean).clamp(min=0.0)
            outs.append(torch.sqrt(var + config.std_eps))
    agg = torch.cat(outs, dim=-1)
    log_deg = torch.log(deg + 1.0)
    scaled = []
    for name in config.scalers:
        if name == "identity":
            scaled.append(agg)
        elif name == "amplification":
            scaled.append(agg * (log_deg / config.avg_deg_log))
        elif name == "attenuation":
            scaled.append(agg * (config.avg_deg_log / log_deg))
        elif name == "linear":
            scaled.append(agg * (deg / config.avg_deg_lin))
        else:  # inverse_linear
            scaled.append(agg * (config.avg_deg_lin / deg))
    return torch.cat(scaled, dim=-1)


class PNAEqLayer(nn.Module):
    """One PNAEq layer: PNA scalar messages + PaiNN vector messages, then the PaiNN update."""

    def __init__(self, hidden: int, num_radial: int, edge_in: int, config: PNAEqConfig) -> None:
        super().__init__()
        self.hidden = hidden
        self.config = config
        self.rbf_emb = nn.Sequential(nn.Linear(num_radial, hidden), nn.Tanh())
        self.edge_emb = nn.Linear(edge_in, hidden) if edge_in > 0 else None
        self.pre = nn.Linear((4 if edge_in > 0 else 3) * hidden, hidden)
        self.scalar_mlp = nn.Sequential(
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, 3 * hidden),
        )
        self.rbf_lin = nn.Linear(num_radial, 3 * hidden, bias=False)
        n_agg = len(config.aggregators) * len(config.scalers)
        self.post = nn.Linear((n_agg + 1) * hidden, hidden)
        self.update = PaiNNUpdate(hidden, config.norm_eps)

    def forward(
        self,
        s: torch.Tensor,
        v: torch.Tensor,
        edge_index: torch.Tensor,
        rbf: torch.Tensor,
        fcut: torch.Tensor,
        unit: torch.Tensor,
        edge_attr: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``s [N,H]``, ``v [N,3,H]``, ``rbf [E,R]``, ``fcut [E]``, ``unit [E,3]``, ``edge_attr [E,Fe]``."""
        src, dst = edge_index[0], edge_index[1]
        num_nodes = s.shape[0]
        feats = [s.index_select(0, dst), s.index_select(0, src), self.rbf_emb(rbf)]
        if self.edge_emb is not None and edge_attr is not None:
            feats.append(self.edge_emb(edge_attr))
        m = self.scalar_mlp(self.pre(torch.cat(feats, dim=-1)))
        m = m * self.rbf_lin(rbf) * fcut.unsqueeze(-1)
        g_vv, g_vs, msg = torch.split(m, self.hidden, dim=-1)
        dv = v.index_select(0, src) * g_vv.unsqueeze(1) + g_vs.unsqueeze(1) * unit.unsqueeze(-1)
        agg = pna_aggregate(msg, fcut, dst, num_nodes, self.config)
        s = s + self.post(torch.cat([s, agg], dim=-1))
        v = v + scatter_sum(dv, dst, num_nodes)
        return self.update(s, v)


@register_encoder("PNAEq")
class PNAEq(EquivariantEncoder):
    """Equivariant PNA encoder: returns ``NodeEmbedding(scalar [N, H], vector [N, 3, C])``."""

    Config = PNAEqConfig
    config: PNAEqConfig

    def __init__(self, dims: EncoderDims, config: PNAEqConfig | None = None) -> None:
        super().__init__(dims, config)
        self.layers = nn.ModuleList(
            PNAEqLayer(dims.hidden_dim, dims.num_radial, max(dims.edge_in, 0), self.config)
            for _ in range(dims.num_conv_layers)
        )
        self.readout = VectorReadout(dims.hidden_dim, self.config.num_vector_channels)

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        s, length, unit, edge_attr = self.edge_inputs(inputs)
        rbf, fcut = self.rbf(length), self.cutoff(length)
        v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        args = (inputs.edge_index, rbf, fcut, unit, edge_attr)
        s, v = self.run_layers(s, v, inputs, self.dims.conv_checkpointing, *args)
        return NodeEmbedding(scalar=s, vector=self.readout(v))
