"""GPS (Rampasek et al. 2022): global attention mixed into every conv layer of an encoder.

``global_attn_engine: "GPS"`` gives the encoder one :class:`GPSLayer` per conv layer (the
encoder's ``mixers``). After conv layer ``l`` the encoder calls
``mixers[l](h_in, h_local, inputs)`` with its invariant node channels before (``h_in``) and
after (``h_local``) the layer; the GPS layer returns::

    x      = h_in (+ Linear(pe) in layer 0 when pe_dim > 0)
    h_attn = LayerNorm(x + Attention(x))               # global, within each graph
    h      = LayerNorm(h_local) + h_attn
    h      = LayerNorm(h + FFN(h))                     # FFN: Linear(H, 2H) -> act -> Linear(2H, H)

Dropout-free; the norms act per node, so a padding sink graph cannot change real outputs.
Equivariant encoders hand over their scalar channels only: the vector channels stay with the
local encoder, and the whole layer is rotation invariant.

Attention types (``global_attn_type``): ``multihead``, exact softmax attention over the nodes
of each graph (an ``[h, N, N]`` score matrix masked with ``batch[:, None] == batch[None, :]``:
quadratic in the batch's nodes), or ``performer`` (:class:`PerformerAttention`, linear).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..encoders.base import EncoderDims, GraphInputs
from ..errors import ModelError
from ..nn.activations import make_activation
from ..nn.scatter import accumulate_dtype
from .performer import PerformerAttention

if TYPE_CHECKING:
    from ..config import ModelConfig

__all__ = ["GPSLayer", "MultiheadAttention", "build_gps_mixers"]

ROOT = "NeuralNetwork.Architecture"


class MultiheadAttention(nn.Module):
    """Exact multi-head softmax attention restricted to the nodes of each graph.

    Written out (not ``scaled_dot_product_attention``) so that it has a double backward on every
    device (forces by autograd are trained with ``create_graph=True``) and no host sync.

    Args:
        hidden_dim: H (a multiple of ``heads``); heads: h, each with ``d = H / h`` channels.
    """

    def __init__(self, hidden_dim: int, heads: int) -> None:
        super().__init__()
        if hidden_dim % heads:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.head_dim = hidden_dim // heads
        self.qkv = nn.Linear(hidden_dim, 3 * hidden_dim)
        self.out = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, h: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
        """Args: ``h [N, H]``, ``batch [N]``, ``num_graphs`` B (unused: the mask separates graphs).
        Returns ``[N, H]``."""
        n = h.shape[0]
        dtype = accumulate_dtype(h.dtype)
        q, k, v = self.qkv(h).to(dtype).reshape(n, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)  # [h, N, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [h, N, N]
        same_graph = batch[:, None] == batch[None, :]  # [N, N]; the diagonal is always True
        scores = scores.masked_fill(~same_graph, float("-inf"))
        att = torch.matmul(torch.softmax(scores, dim=-1), v)  # [h, N, d]
        return self.out(att.permute(1, 0, 2).reshape(n, self.heads * self.head_dim).to(h.dtype))


class GPSLayer(nn.Module):
    """One GPS mixing layer (see the module docstring).

    Args:
        hidden_dim: H; heads: attention heads; attn_type: ``multihead`` or ``performer``;
        num_features: performer random features per head; pe_dim: positional encodings read by
        this layer (``inputs.pe [N, 2 * pe_dim]``; 0 for every layer but the first);
        activation: FFN activation name (``Architecture.activation``).
    """

    def __init__(
        self, hidden_dim: int, heads: int, attn_type: str, num_features: int, pe_dim: int, activation: str
    ) -> None:
        super().__init__()
        if attn_type == "multihead":
            self.attn: nn.Module = MultiheadAttention(hidden_dim, heads)
        elif attn_type == "performer":
            self.attn = PerformerAttention(hidden_dim, heads, num_features)
        else:
            raise ModelError(f"{ROOT}.global_attn_type: expected 'multihead' or 'performer', found {attn_type!r}")
        self.pe_dim = pe_dim
        self.pe_proj = nn.Linear(2 * pe_dim, hidden_dim) if pe_dim else None
        self.norm_local = nn.LayerNorm(hidden_dim)
        self.norm_attn = nn.LayerNorm(hidden_dim)
        self.norm_ff = nn.LayerNorm(hidden_dim)
        self.ff = nn.Sequential(
            nn.Linear(hidden_dim, 2 * hidden_dim), make_activation(activation), nn.Linear(2 * hidden_dim, hidden_dim)
        )

    def _positional(self, inputs: GraphInputs, like: torch.Tensor) -> torch.Tensor:
        """``Linear(pe) [N, H]``; in training the Laplacian eigenvector signs are flipped at random
        per graph and eigenvector (the sign of an eigenvector is arbitrary)."""
        pe = inputs.pe
        if pe is None or pe.shape[-1] != 2 * self.pe_dim:
            found = None if pe is None else tuple(pe.shape)
            raise ModelError(
                f"{ROOT}.pe_dim is {self.pe_dim}: GPS needs positional encodings inputs.pe [N, {2 * self.pe_dim}], "
                f"found {found} (add lap_pe / rw_pe with hydragnn.data.add_positional_encodings)"
            )
        pe = pe.to(like.dtype)
        if self.training:
            signs = torch.randint(0, 2, (inputs.num_graphs, self.pe_dim), device=pe.device).to(pe.dtype) * 2 - 1
            pe = torch.cat([pe[:, : self.pe_dim] * signs.index_select(0, inputs.batch), pe[:, self.pe_dim :]], dim=-1)
        assert self.pe_proj is not None  # forward calls this only with a projection
        return self.pe_proj(pe)

    def forward(self, h_in: torch.Tensor, h_local: torch.Tensor, inputs: GraphInputs) -> torch.Tensor:
        """Args: ``h_in [N, H]`` (layer input), ``h_local [N, H]`` (local conv update), ``inputs``
        (``batch``, ``num_graphs``, ``pe``). Returns the mixed node features ``[N, H]``."""
        x = h_in
        if self.pe_proj is not None:
            x = x + self._positional(inputs, x)
        h_attn = self.norm_attn(x + self.attn(x, inputs.batch, inputs.num_graphs))
        h = self.norm_local(h_local) + h_attn
        return self.norm_ff(h + self.ff(h))


def build_gps_mixers(config: ModelConfig, dims: EncoderDims) -> nn.ModuleList:
    """One :class:`GPSLayer` per conv layer for a :class:`~hydragnn.models.ModelConfig` with
    ``attention.engine == "GPS"``; only the first layer reads the positional encodings."""
    heads, hidden = config.attention.heads, dims.hidden_dim
    if hidden % heads:
        raise ModelError(f"{ROOT}.global_attn_heads: hidden_dim ({hidden}) must be a multiple of {heads}")
    return nn.ModuleList(
        GPSLayer(
            hidden,
            heads,
            config.attention.attn_type,
            config.attention.features,
            config.attention.pe_dim if layer == 0 else 0,
            config.activation,
        )
        for layer in range(dims.num_conv_layers)
    )
