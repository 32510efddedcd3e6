"""Equivariant all-to-all transformer (``global_attn_engine: "EquivariantTransformer"``).

Every atom attends to every atom of its own graph. Nodes carry invariant scalars ``s [N, H]``
and l=1 vectors ``v [N, 3, H]``; a layer with ``heads`` heads of width ``d = H / heads`` is

* attention weights ``a_ij^h = softmax_j(q_i^h . k_j^h / sqrt(d) + b^h(|r_ij|))`` over the
  atoms j of i's graph (other graphs get a large negative score through the additive mask
  ``batch[:, None] == batch[None, :]``), with ``q, k`` linear in the layer-normed scalars and
  ``b`` a learned function of a Gaussian basis of the distance: invariant by construction;
* scalar update ``s_i += W_o sum_j a_ij W_v s_j``;
* vector update ``v_i += W_ov sum_j a_ij (W_vv v_j + g^h(|r_ij|) f(s_j) u_ij)`` with
  ``u_ij = r_ij / sqrt(|r_ij|^2 + delta^2)`` (``r_ij = pos_j - pos_i``, ``delta`` =
  :data:`DIRECTION_SMOOTHING` Å): a smooth, bounded direction that is exactly 0 for i == j and
  for coincident atoms (padding sink), so values and gradients stay finite;
* the PaiNN update block (gated mixing of vector norms and inner products into the scalars,
  scalar gates on the vectors).

All weights act on channels only and all geometry enters through ``r_ij`` (rotated with the
positions) or ``|r_ij|`` (invariant), so scalars are rotation / translation invariant and
vectors rotation equivariant exactly, up to round-off.

Periodic systems: the stage sees the atoms of a cell once, at ``inputs.pos``, with no periodic
images (an all-to-all sum over an infinite crystal does not converge); the local encoder, when
there is one, handles the periodic images through its edges. Results therefore depend on how a
crystal is cut into a cell (a supercell is not equivalent to its primitive cell).

Cost: the batch is attended as one ``[heads, N, N]`` matrix masked per graph (no data-dependent
shapes, so it is capture-safe), i.e. quadratic in the atoms of the whole batch. Keep batches of
many small graphs modest, or use GPS with the performer for large systems.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModelConfig
from ..encoders import Encoder, EncoderDims, GraphInputs, NodeEmbedding
from ..encoders.basis import GaussianRBF
from ..encoders.equivariant_utils import AtomEmbedding, PaiNNUpdate, call_layer, check_dims
from ..errors import ModelConfigError, ModelError
from ..ops import accumulate_dtype, safe_norm

ROOT = "NeuralNetwork.Architecture"
DIRECTION_SMOOTHING = 1e-2
"""``delta`` (Å) of the smooth direction ``r / sqrt(|r|^2 + delta^2)``."""
NORM_EPS = 1e-2
"""``eps`` of the smooth vector norm ``sqrt(|v|^2 + eps)`` in the PaiNN update block."""
RANGE_FACTOR = 2.0
"""The radial basis of the attention bias spans ``[0, RANGE_FACTOR * radius]``; beyond it the
bias is a learned constant (pure content attention)."""


def pair_geometry(
    pos: torch.Tensor, batch: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All-pairs distances, smooth directions and the same-graph mask.

    Args:
        pos: ``[N, 3]`` positions (geometry is computed in float32 at least).
        batch: ``[N]`` graph index of each node.
        dtype: dtype of the returned distances and directions.

    Returns:
        ``dist [N, N]`` (``|pos_j - pos_i|``, 0 on the diagonal, zero gradient there),
        ``unit [N, N, 3]`` (``r_ij / sqrt(|r_ij|^2 + delta^2)``, 0 for i == j) and
        ``same [N, N]`` bool (i and j in the same graph).
    """
    pos = pos.to(accumulate_dtype(pos.dtype))
    rel = pos.unsqueeze(0) - pos.unsqueeze(1)  # [i, j, 3] = pos_j - pos_i
    dist = safe_norm(rel)
    unit = rel / torch.sqrt((rel * rel).sum(dim=-1, keepdim=True) + DIRECTION_SMOOTHING**2)
    same = batch.unsqueeze(0) == batch.unsqueeze(1)
    return dist.to(dtype), unit.to(dtype), same


class EquivariantAttentionLayer(nn.Module):
    """One all-to-all layer: attention on scalars and vectors, then the PaiNN update block.

    Args:
        hidden: width H of scalars and vector channels.
        heads: attention heads (H must be a multiple).
        num_radial: size of the distance basis.
    """

    def __init__(self, hidden: int, heads: int, num_radial: int) -> None:
        super().__init__()
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.source = nn.Linear(hidden, hidden)  # f(s_j): channel gates of the geometric vector message
        self.radial = nn.Linear(num_radial, 2 * heads)  # attention bias b^h and geometric gate g^h
        self.vec_value = nn.Linear(hidden, hidden, bias=False)  # W_vv
        self.out_scalar = nn.Linear(hidden, hidden)
        self.out_vector = nn.Linear(hidden, hidden, bias=False)
        self.update = PaiNNUpdate(hidden, NORM_EPS)

    def forward(
        self, s: torch.Tensor, v: torch.Tensor, rbf: torch.Tensor, unit: torch.Tensor, same: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update ``s [N, H]`` and ``v [N, 3, H]`` from ``rbf [N, N, R]``, ``unit [N, N, 3]``, ``same [N, N]``."""
        n, heads, d = s.shape[0], self.heads, self.head_dim
        x = self.norm(s)
        q, k, val = self.qkv(x).view(n, 3, heads, d).unbind(dim=1)  # [N, heads, d] each
        bias, gate = self.radial(rbf).permute(2, 0, 1).split(heads, dim=0)  # [heads, N, N] each
        scores = torch.einsum("ihd,jhd->hij", q, k) * (1.0 / math.sqrt(d)) + bias
        scores = scores.to(accumulate_dtype(scores.dtype))  # softmax in float32 for 16-bit models
        scores = torch.where(same, scores, torch.full_like(scores, torch.finfo(scores.dtype).min))
        attn = torch.softmax(scores, dim=-1).to(s.dtype)  # [heads, N, N], rows sum to 1 within a graph
        ds = torch.einsum("hij,jhd->ihd", attn, val).reshape(n, self.hidden)
        vv = self.vec_value(v).view(n, 3, heads, d)
        dv = torch.einsum("hij,jchd->ichd", attn, vv)
        src = self.source(x).view(n, heads, d)
        dv = dv + torch.einsum("hij,ijc,jhd->ichd", attn * gate, unit, src)
        s = s + self.out_scalar(ds)
        v = v + self.out_vector(dv.reshape(n, 3, self.hidden))
        return self.update(s, v)


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
        hidden, heads = dims.hidden_dim, config.global_attn_heads
        if heads <= 0 or hidden % heads:
            raise ModelConfigError(
                f"{ROOT}.global_attn_heads: hidden_dim ({hidden}) must be a multiple of global_attn_heads ({heads})"
            )
        if local is not None and not isinstance(local, nn.Module):
            raise ModelError(f"EquivariantTransformer: local must be the encoder instance, found {local!r}")
        self.dims = dims
        self.num_layers = config.global_attn_layers or config.num_conv_layers
        self.checkpointing = bool(dims.conv_checkpointing)
        self.standalone = local is None
        self.mixers: nn.ModuleList | None = None  # the encoder interface (no GPS mixing here)
        self.embedding = AtomEmbedding(dims) if local is None else None
        channels = int(getattr(local, "vector_channels", 0)) if local is not None else 0
        self.local_channels = channels
        self.vector_in = nn.Linear(channels, hidden, bias=False) if channels > 0 else None
        self.rbf = GaussianRBF(RANGE_FACTOR * dims.radius, dims.num_radial)
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
        dist, unit, same = pair_geometry(inputs.pos, inputs.batch, s.dtype)
        rbf = self.rbf(dist)  # [N, N, R]
        for layer in self.layers:
            s, v = call_layer(layer, self.checkpointing, s, v, rbf, unit, same)
        return NodeEmbedding(scalar=s, vector=v)
