"""Equivariant all-to-all transformer (``global_attn_engine: "EquivariantTransformer"``).

Every atom attends to every atom of its own graph. Nodes carry scalars ``s [N, H]`` and l=1
vectors ``v [N, 3, H]``; a layer with ``heads`` heads is

* attention ``a_ij = softmax_j(q_i . k_j / sqrt(d) + b(|r_ij|))`` within each graph, ``q, k``
  linear in the layer-normed scalars, ``b`` learned on a Gaussian basis over ``[0, RANGE_FACTOR
  * radius]``;
* distance filters on the values as in TorchMD-Net's equivariant transformer:
  ``phi(r) = n_g (W rbf(r)) env(r) + c`` (``n_g`` atoms in the graph, so uniform attention gives a
  continuous-filter sum over neighbours rather than an average diluted by the cell size);
* ``s_i += W_o sum_j a_ij phi_s W_v s_j``, ``v_i += W_ov sum_j a_ij (phi_v W_vv v_j + psi f(s_j)
  u_ij)`` with the smooth direction ``u_ij = r_ij / sqrt(|r_ij|^2 + delta^2)`` (0 for i == j and
  coincident atoms), then the PaiNN update block.

Weights act on channels only and geometry enters through ``r_ij`` or ``|r_ij|``: scalars are
invariant and vectors equivariant exactly. Periodic cells use the minimum image
(:func:`hydragnn.models.nn.geometry.minimum_image`, differentiable in positions and cell): each
pair counts once, at its nearest image, so results depend on how a crystal is cut into a cell
and the attention bias may jump where a pair crosses the half-cell boundary.

Layout: training lays the batch out per graph (``[B, n_max]``, ``n_max`` read on the host);
eval (inference, capture) uses one masked ``[N, N]`` block, capture-safe but quadratic in the
batch's atoms. Both compute the same function (tested). Use GPS with the performer for large
systems.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModelConfig
from ..encoders import Encoder, EncoderDims, GraphInputs, NodeEmbedding
from ..encoders.equivariant_utils import AtomEmbedding, call_layer, check_dims
from ..errors import ModelConfigError, ModelError
from ..nn.geometry import dense_pair_geometry, pair_geometry
from ..nn.painn import PaiNNUpdate
from ..nn.radial import CosineCutoff, GaussianRBF
from ..nn.scatter import accumulate_dtype, rank_in_group

ROOT = "NeuralNetwork.Architecture"
NORM_EPS = 1e-2
"""``eps`` of the smooth vector norm ``sqrt(|v|^2 + eps)`` in the PaiNN update block."""
RANGE_FACTOR = 2.0
"""The radial basis of the attention bias spans ``[0, RANGE_FACTOR * radius]``; beyond it the
bias is a learned constant (pure content attention)."""


def graph_layout(batch: torch.Tensor, num_graphs: int) -> tuple[torch.Tensor, int]:
    """Slot of every node in a per-graph ``[B, n_max]`` layout, and ``n_max``.

    Nodes keep their order within their graph (``batch`` need not be sorted). Reads ``n_max`` on
    the host: a synchronisation, so only for eager training, never for capture.
    """
    slot = rank_in_group(batch, torch.arange(batch.shape[0], device=batch.device), num_graphs)
    return slot, int(torch.bincount(batch, minlength=num_graphs).max()) if batch.numel() else 0


class EquivariantAttentionLayer(nn.Module):
    """One all-to-all layer: filtered attention on scalars and vectors, then the PaiNN update block.

    Args:
        hidden: width H of scalars and vector channels.
        heads: attention heads (H must be a multiple).
        num_radial: size of the distance bases (attention bias and value filters).
    """

    def __init__(self, hidden: int, heads: int, num_radial: int) -> None:
        super().__init__()
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.source = nn.Linear(hidden, hidden)  # f(s_j): channel gates of the geometric vector message
        self.bias = nn.Linear(num_radial, heads)  # attention bias b^h(|r_ij|)
        self.filters = nn.Linear(num_radial, 3 * hidden)  # phi_s, phi_v, psi before envelope and n_g
        self.filter_const = nn.Parameter(torch.ones(2 * hidden))  # c of phi_s, phi_v
        self.vec_value = nn.Linear(hidden, hidden, bias=False)  # W_vv
        self.out_scalar = nn.Linear(hidden, hidden)
        self.out_vector = nn.Linear(hidden, hidden, bias=False)
        self.update = PaiNNUpdate(hidden, NORM_EPS)

    def forward(
        self,
        s: torch.Tensor,
        v: torch.Tensor,
        rbf: torch.Tensor,
        filter_rbf: torch.Tensor,
        envelope: torch.Tensor,
        unit: torch.Tensor,
        same: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update the node features of ``B`` blocks of ``n`` nodes (attention within a block only
        where ``same`` holds).

        Args:
            s: ``[B, n, H]`` scalars.
            v: ``[B, n, 3, H]`` vectors.
            rbf: ``[B, n, n, R]`` distance basis of the attention bias (over ``[0, RANGE_FACTOR * radius]``).
            filter_rbf: ``[B, n, n, R]`` distance basis of the value filters (over ``[0, radius]``).
            envelope: ``[B, n, n]`` smooth cutoff of the value filters (1 at 0, 0 beyond ``radius``).
            unit: ``[B, n, n, 3]`` smooth directions ``u_ij``.
            same: ``[B, n, n]`` bool same-graph mask.

        Returns:
            ``(s [B, n, H], v [B, n, 3, H])``.
        """
        b, n, heads, d = s.shape[0], s.shape[1], self.heads, self.head_dim
        x = self.norm(s)
        q, k, val = self.qkv(x).view(b, n, 3, heads, d).unbind(dim=2)  # [B, n, heads, d] each
        bias = self.bias(rbf).permute(0, 3, 1, 2)  # [B, heads, n, n]
        scores = torch.einsum("bihd,bjhd->bhij", q, k) * (1.0 / math.sqrt(d)) + bias
        scores = scores.to(accumulate_dtype(scores.dtype))  # softmax in float32 for 16-bit models
        scores = torch.where(same.unsqueeze(1), scores, torch.full_like(scores, torch.finfo(scores.dtype).min))
        attn = torch.softmax(scores, dim=-1).to(s.dtype)  # [B, heads, n, n], rows sum to 1 within a graph
        size = same.sum(dim=-1, keepdim=True).to(s.dtype)  # [B, n, 1] atoms in i's graph
        filters = self.filters(filter_rbf) * (envelope * size).unsqueeze(-1)  # [B, n, n, 3H], local part
        const = torch.cat([self.filter_const, self.filter_const.new_zeros(self.hidden)])
        weights = attn.permute(0, 2, 3, 1)[..., None, :, None] * (filters + const).view(b, n, n, 3, heads, d)
        w_s, w_v, w_u = weights.unbind(dim=3)  # [B, i, j, heads, d]: a_ij^h * filter_ij
        ds = torch.einsum("bijhd,bjhd->bihd", w_s, val).reshape(b, n, self.hidden)
        vv = self.vec_value(v).view(b, n, 3, heads, d)
        src = self.source(x).view(b, n, heads, d)
        dv = torch.einsum("bijhd,bjchd->bichd", w_v, vv) + torch.einsum("bijhd,bijc,bjhd->bichd", w_u, unit, src)
        s = s + self.out_scalar(ds)
        v = v + self.out_vector(dv.reshape(b, n, 3, self.hidden))
        s, v = self.update(s.reshape(b * n, self.hidden), v.reshape(b * n, 3, self.hidden))
        return s.view(b, n, self.hidden), v.view(b, n, 3, self.hidden)


class EquivariantTransformer(nn.Module):
    """The equivariant all-to-all transformer, standalone or after a local encoder.

    Args:
        dims: the model's :class:`EncoderDims` (hidden_dim, num_radial, radius, species).
        config: the :class:`ModelConfig` (``global_attn_heads``, ``global_attn_layers`` or
            ``num_conv_layers``).
        local: the local encoder instance when the transformer follows one (its scalars
            ``[N, H]`` start the transformer and its vectors ``[N, 3, C]`` are projected to H
            channels by a bias-free channel map; ``C = local.vector_channels`` may be 0), or
            ``None`` for a standalone transformer (species embedding, vectors start at zero).

    Call as ``forward(inputs)`` (standalone) or ``forward(inputs, local_embedding)``; returns
    ``NodeEmbedding(scalar [N, H], vector [N, 3, H])``.

    Raises:
        ModelConfigError: when ``hidden_dim`` is not a multiple of ``global_attn_heads`` or a
            size is not positive.
    """

    equivariant = True
    needs_pos = True

    def __init__(self, dims: EncoderDims, config: ModelConfig, local: Encoder | None = None) -> None:
        super().__init__()
        check_dims(dims, "EquivariantTransformer")
        hidden, heads = dims.hidden_dim, config.attention.heads
        if heads <= 0 or hidden % heads:
            raise ModelConfigError(
                f"{ROOT}.global_attn_heads: hidden_dim ({hidden}) must be a multiple of global_attn_heads ({heads})"
            )
        if local is not None and not isinstance(local, nn.Module):
            raise ModelError(f"EquivariantTransformer: local must be the encoder instance, found {local!r}")
        self.dims = dims
        self.num_layers = config.attention.layers or config.num_conv_layers
        self.checkpointing = bool(dims.conv_checkpointing)
        self.standalone = local is None
        self.mixers: nn.ModuleList | None = None  # the encoder interface (no GPS mixing here)
        self.embedding = AtomEmbedding(dims) if local is None else None
        channels = int(getattr(local, "vector_channels", 0)) if local is not None else 0
        self.local_channels = channels
        self.vector_in = nn.Linear(channels, hidden, bias=False) if channels > 0 else None
        self.rbf = GaussianRBF(RANGE_FACTOR * dims.radius, dims.num_radial)
        self.envelope = CosineCutoff(dims.radius)
        self.filter_rbf = GaussianRBF(dims.radius, dims.num_radial)
        self.layers = nn.ModuleList(
            EquivariantAttentionLayer(hidden, heads, dims.num_radial) for _ in range(self.num_layers)
        )

    @property
    def vector_channels(self) -> int:
        """C of the returned vectors ``[N, 3, C]`` (= hidden_dim)."""
        return self.dims.hidden_dim

    def forward(self, inputs: GraphInputs, local: NodeEmbedding | None = None) -> NodeEmbedding:
        """Node embeddings ``NodeEmbedding(scalar [N, H], vector [N, 3, H])``.

        Args:
            inputs: the graph inputs (``pos [N, 3]``, ``batch [N]``, ``x`` when standalone).
            local: the local encoder's embedding (required when built with ``local``).
        """
        if inputs.pos is None:
            raise ModelError("EquivariantTransformer needs positions: GraphInputs.pos is None")
        if self.standalone:
            assert self.embedding is not None
            s = self.embedding(inputs.x)
            v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        else:
            if local is None:
                raise ModelError("EquivariantTransformer built after a local encoder needs its NodeEmbedding")
            s = local.scalar
            if self.vector_in is not None and local.vector is not None:
                v = self.vector_in(local.vector.to(s.dtype))
            else:
                v = s.new_zeros((s.shape[0], 3, s.shape[1]))
        where: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.training:  # per graph: [B, n_max] blocks (a host sync; training is never captured)
            slot, width = graph_layout(inputs.batch, inputs.num_graphs)
            where = (inputs.batch, slot)
            valid = torch.zeros(inputs.num_graphs, width, dtype=torch.bool, device=s.device).index_put(
                where, torch.ones_like(slot, dtype=torch.bool)
            )
            pos = inputs.pos.new_zeros(inputs.num_graphs, width, 3).index_put(where, inputs.pos)
            dist, unit, same = dense_pair_geometry(pos, valid, s.dtype, inputs.cell, inputs.pbc)
            s = s.new_zeros(inputs.num_graphs, width, s.shape[-1]).index_put(where, s)
            v = v.new_zeros(inputs.num_graphs, width, 3, v.shape[-1]).index_put(where, v)
        else:  # one masked [N, N] block: no data-dependent shape, capture-safe
            dist, unit, same = pair_geometry(inputs.pos, inputs.batch, s.dtype, inputs.cell, inputs.pbc)
            dist, unit, same, s, v = dist[None], unit[None], same[None], s[None], v[None]
        rbf = self.rbf(dist)  # [B, n, n, R]
        envelope = self.envelope(dist)  # [B, n, n]
        filter_rbf = self.filter_rbf(dist)  # [B, n, n, R]
        for layer in self.layers:
            s, v = call_layer(layer, self.checkpointing, s, v, rbf, filter_rbf, envelope, unit, same)
        if where is not None:
            return NodeEmbedding(scalar=s[where], vector=v[where])
        return NodeEmbedding(scalar=s[0], vector=v[0])
