"""DimeNet++ (Gasteiger et al. 2020, "Fast and Uncertainty-Aware Directional Message Passing").

Directional messages live on edges ``j -> i``; each interaction mixes the messages of the edges
``k -> j`` arriving at ``j`` through a spherical basis of ``d_kj`` and the angle at ``j``. Output
blocks scatter edge messages to their targets; their sum is the node embedding ``[N, hidden_dim]``.

Built here, not through ``torch_geometric.nn.DimeNetPlusPlus`` (which needs ``radius_graph`` and
``SparseTensor``): edges come ready in :class:`GraphInputs`, triplets are plain torch
(:mod:`hydragnn.models.nn.triplets`), the bases are NaN-safe
(:mod:`hydragnn.models.nn.dimenet_basis`); PyG's ``InteractionPPBlock`` and ``OutputPPBlock``
are reused; the last output layer is glorot-initialised (a zero layer would make the output
identically zero at initialisation). Angles follow PyG's convention on the edge
vectors of :class:`GraphInputs` (periodic shifts included).

Cost: the first basis projection ``W_sbf1 a(d_kj, angle)`` is factorised as ``sum_l Y_l(angle)
(sum_n W_sbf1[:, l, n] rad_ln(d_kj))``, the inner sum taken once per edge, so only
``L * basis_emb_size`` numbers are gathered per triplet (:class:`_FactorizedInteractionPPBlock`;
same weights and results as PyG's block).

Distinct triplet geometry: the spherical basis and its two projections depend on a triplet only
through ``(d_kj, angle)``. When those are constants of the call (no forces or stress through
them), on CPU, with the exact triplet list, and repeating (lattice data), they are evaluated
once per distinct pair and gathered back (the default ``"distinct"``
implementation of :class:`~hydragnn.models.nn.TripletRows`, :mod:`hydragnn.models.nn.distinct`;
same values).

Capture safety: ``triplet_capacity = None`` (default) builds the exact, data-dependent triplet
list; ``triplet_capacity = C`` a fixed ``E * C`` layout with 0/1 weights, exact when no node has
more than ``C`` incoming edges. Geometry and bases are float32 for 16-bit models; a sink node's
zero-length edges are backtracking pairs (weight 0), with finite bases and zero gradients.
"""

from __future__ import annotations

import math

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch_geometric.nn.models.dimenet import InteractionPPBlock, OutputPPBlock
from torch_geometric.utils import scatter

from ..encoder_configs.geometric import DimeNetConfig
from ..errors import ModelError
from ..nn.dimenet_basis import BesselEdgeBasis, SphericalBasis, _compute_dtype
from ..nn.geometry import TripletRows, safe_norm
from ..nn.triplets import build_triplets, build_triplets_padded
from .base import Encoder, EncoderDims, GraphInputs, NodeEmbedding, register_encoder

_EPS = 1e-9


class _FactorizedInteractionPPBlock(InteractionPPBlock):
    """PyG's :class:`InteractionPPBlock` (same parameters) fed with the factorised spherical basis.

    ``forward(x [E, H], rbf [E, R], rad [D, L, R], ang [Q, L], rad_index [Q], expand [T] or None,
    idx_kj [T], idx_ji [T]) -> [E, H]`` where the 2D basis of row ``q`` is
    ``rad[rad_index[q], l, n] * ang[q, l]`` (``ang`` already multiplied by the triplet weight of
    the padded layout) and triplet ``t`` takes row ``expand[t]`` (row ``t`` when ``expand`` is
    None: then ``D = E``, ``Q = T`` and ``rad_index = idx_kj``).
    """

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        rbf: torch.Tensor,
        rad: torch.Tensor,
        ang: torch.Tensor,
        rad_index: torch.Tensor,
        expand: torch.Tensor | None,
        idx_kj: torch.Tensor,
        idx_ji: torch.Tensor,
    ) -> torch.Tensor:
        x_ji = self.act(self.lin_ji(x))
        x_kj = self.act(self.lin_kj(x))
        x_kj = x_kj * self.lin_rbf2(self.lin_rbf1(rbf))
        x_kj = self.act(self.lin_down(x_kj))  # [E, I]

        num_spherical = ang.shape[-1]
        w1 = self.lin_sbf1.weight  # [B, L * R], input index l * R + n
        w1 = w1.view(w1.shape[0], num_spherical, -1)  # [B, L, R]
        per_edge = torch.einsum("eln,bln->elb", rad, w1)  # [D, L, B]
        sbf = (per_edge.index_select(0, rad_index) * ang.unsqueeze(-1)).sum(dim=1)  # [Q, B] = lin_sbf1(rad * ang)
        sbf = self.lin_sbf2(sbf)  # [Q, I]
        if expand is not None:
            sbf = sbf.index_select(0, expand)  # [T, I]
        x_kj = x_kj.index_select(0, idx_kj) * sbf  # [T, I]
        x_kj = scatter(x_kj, idx_ji, dim=0, dim_size=x.shape[0], reduce="sum")  # [E, I]
        x_kj = self.act(self.lin_up(x_kj))

        h = x_ji + x_kj
        for layer in self.layers_before_skip:
            h = layer(h)
        h = self.act(self.lin(h)) + x
        for layer in self.layers_after_skip:
            h = layer(h)
        return h


class _EdgeEmbedding(nn.Module):
    """Initial edge messages ``m_ji = act(W [h_i, h_j, act(W_rbf rbf_ji)])``: ``[E, H]``."""

    def __init__(self, num_radial: int, hidden: int) -> None:
        super().__init__()
        self.act = nn.SiLU()
        self.lin_rbf = nn.Linear(num_radial, hidden)
        self.lin = nn.Linear(3 * hidden, hidden)

    def forward(self, h: torch.Tensor, rbf: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        rbf = self.act(self.lin_rbf(rbf))
        return self.act(self.lin(torch.cat([h.index_select(0, dst), h.index_select(0, src), rbf], dim=-1)))


@register_encoder("DimeNet")
class DimeNetEncoder(Encoder):
    """DimeNet++ stack: ``num_conv_layers`` interaction blocks and ``num_conv_layers + 1``
    output blocks summed into ``scalar [N, hidden_dim]``. Invariant (``vector`` is None)."""

    hops_beyond_layers = 1  # the embedding block's messages already span one shell

    Config = DimeNetConfig
    config: DimeNetConfig
    equivariant = False
    needs_pos = True
    supports_layer_mixing = False  # per-layer state is edge messages

    def __init__(self, dims: EncoderDims, config: DimeNetConfig) -> None:
        super().__init__(dims, config)
        hidden, num_radial = dims.hidden_dim, dims.num_radial
        if dims.num_species > 0:
            self.species = nn.Embedding(dims.num_species, hidden)
            with torch.no_grad():
                self.species.weight.uniform_(-math.sqrt(3.0), math.sqrt(3.0))
            self.node_lin = None
        else:
            self.species = None
            self.node_lin = nn.Linear(dims.node_in, hidden)
        self.rbf = BesselEdgeBasis(num_radial, dims.radius, config.envelope_exponent)
        self.sbf = SphericalBasis(config.num_spherical, num_radial, dims.radius, config.envelope_exponent)
        self.rows = TripletRows()
        self.emb = _EdgeEmbedding(num_radial, hidden)
        act = nn.SiLU()
        self.output_blocks = nn.ModuleList(
            OutputPPBlock(
                num_radial,
                hidden,
                config.out_emb_size,
                hidden,
                config.num_output_layers,
                act,
                output_initializer="glorot_orthogonal",
            )
            for _ in range(dims.num_conv_layers + 1)
        )
        self.interaction_blocks = nn.ModuleList(
            _FactorizedInteractionPPBlock(
                hidden,
                config.int_emb_size,
                config.basis_emb_size,
                config.num_spherical,
                num_radial,
                config.num_before_skip,
                config.num_after_skip,
                act,
            )
            for _ in range(dims.num_conv_layers)
        )

    def _node_features(self, x: torch.Tensor) -> torch.Tensor:
        if self.species is not None:
            return self.species(x[:, 0].long())
        assert self.node_lin is not None  # __init__ builds it when there are no species
        return self.node_lin(x)

    def triplets(
        self, edge_index: torch.Tensor, num_nodes: int, edge_vec: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(idx_kj, idx_ji, weight or None)`` per the configured layout (see module docstring)."""
        if self.config.triplet_capacity is None:
            idx_kj, idx_ji = build_triplets(edge_index, num_nodes, edge_vec)
            return idx_kj, idx_ji, None
        return build_triplets_padded(edge_index, num_nodes, self.config.triplet_capacity, edge_vec)

    def _block(self, t: int, m, rbf, rad, ang, rad_index, expand, idx_kj, idx_ji, dst, num_nodes: int):
        m = self.interaction_blocks[t](m, rbf, rad, ang, rad_index, expand, idx_kj, idx_ji)
        return m, self.output_blocks[t + 1](m, rbf, dst, num_nodes=num_nodes)

    def forward(self, inputs: GraphInputs) -> NodeEmbedding:
        """``inputs.edge_vec [E, 3]`` -> ``NodeEmbedding(scalar [N, hidden_dim])``."""
        if inputs.edge_vec is None:
            raise ModelError("DimeNet needs positions: GraphInputs.edge_vec is None")
        num_nodes = inputs.num_nodes
        dtype = self.emb.lin.weight.dtype  # the module dtype
        edge_index, vec = inputs.edge_index, inputs.edge_vec
        if vec.dtype not in (torch.float32, torch.float64):
            vec = vec.float()  # geometry and bases in at least float32, cast to the module dtype below
        src, dst = edge_index[0], edge_index[1]
        dist = safe_norm(vec)  # recomputed from vec: NaN-free gradient at zero length

        idx_kj, idx_ji, weight = self.triplets(edge_index, num_nodes, vec)
        len_kj = torch.clamp(dist.index_select(0, idx_kj), min=_EPS)
        len_ji = torch.clamp(dist.index_select(0, idx_ji), min=_EPS)
        cos_angle = (vec.index_select(0, idx_ji) * vec.index_select(0, idx_kj)).sum(dim=-1) / (len_kj * len_ji)

        rbf = self.rbf(dist).to(dtype)  # [E, R]
        work = _compute_dtype(dist.dtype)
        # the padded layout weighs each triplet's row: one row per triplet (the stock forward)
        rows = self.rows if weight is None else self.rows.forward
        rad_at, rad_index, cos_at, expand = rows(dist, cos_angle, idx_kj)
        rad = self.sbf.radial(rad_at.to(work)).to(dtype)  # [D, L, R]
        ang = self.sbf.angular(cos_at.to(work))  # [Q, L]
        if weight is not None:
            ang = ang * weight.to(ang.dtype).unsqueeze(-1)  # the blocks' sbf maps have no bias
        ang = ang.to(dtype)

        h = self._node_features(inputs.x.to(dtype))
        m = self.emb(h, rbf, dst, src)  # [E, H]
        out = self.output_blocks[0](m, rbf, dst, num_nodes=num_nodes)
        shared_args = (rbf, rad, ang, rad_index, expand, idx_kj, idx_ji, dst, num_nodes)
        for t in range(len(self.interaction_blocks)):
            if self.dims.conv_checkpointing:
                m, p = checkpoint(self._block, t, m, *shared_args, use_reentrant=False)
            else:
                m, p = self._block(t, m, *shared_args)
            out = out + p
        return NodeEmbedding(scalar=out)
