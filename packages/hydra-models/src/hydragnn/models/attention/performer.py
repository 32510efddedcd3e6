"""Performer attention (FAVOR+, Choromanski et al. 2021), per graph and linear in the nodes.

Softmax attention ``softmax(q k^T / sqrt(d)) v`` is approximated with positive random features
``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)`` (``x' = x / d^(1/4)``, ``W [m, d]`` block-orthogonal
Gaussian rows), so that ``exp(q' . k') = E[phi(q') . phi(k')]``. Each node attends to the nodes
of its own graph only: the key/value summaries ``sum_j phi(k_j) v_j^T`` and ``sum_j phi(k_j)``
are scatter sums over ``batch`` into ``num_graphs`` buckets, so the cost is ``O(N m d)``.

The projection ``W`` is a persistent buffer (saved in state dicts and artifacts). Training
redraws it periodically with :func:`redraw_projections`, which draws every performer of a model
from a generator seeded by ``(seed, count)``: every DDP rank draws the same projection. The
bookkeeping (when to redraw) lives in the trainer, never in ``forward``.

Capture-safe: fixed shapes, no host synchronisation; the numerical stabilisers (row maxima for
queries, per-graph maxima for keys) are detached constants that cancel exactly in the ratio.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.scatter import accumulate_dtype

__all__ = ["PerformerAttention", "orthogonal_gaussian", "redraw_projections"]

_EPS = 1e-6
"""Added to the random features (relative to their stabilised maximum of 1), as in FAVOR+."""


def orthogonal_gaussian(
    num_features: int, dim: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Block-orthogonal Gaussian random matrix ``[num_features, dim]``.

    Rows come in blocks of ``dim`` mutually orthogonal directions (QR of a Gaussian matrix), each
    row scaled by the norm of an independent Gaussian vector, so every row is marginally
    ``N(0, I_dim)`` (the FAVOR+ "ORF" estimator, lower variance than i.i.d. rows).

    Args:
        num_features: m; dim: d; generator: a CPU generator (``None``: torch's global RNG).
        dtype: result dtype (drawn in float64 on the CPU, then cast).
    """
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        gauss = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)
        q = q * torch.sign(torch.diagonal(r))  # unique QR: Haar-distributed q
        blocks.append(q.T)
    rows = torch.cat(blocks, dim=0)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (rows * norms).to(dtype)


class PerformerAttention(nn.Module):
    """Multi-head FAVOR+ attention within each graph of a batch.

    Args:
        hidden_dim: H (a multiple of ``heads``).
        heads: number of heads h; each has ``d = H / h`` channels.
        num_features: random features m per head (``Architecture.global_attn_features``).

    Buffers:
        projection: ``[m, d]`` random projection shared by the heads (persistent).
    """

    projection: torch.Tensor

    def __init__(self, hidden_dim: int, heads: int, num_features: int) -> None:
        super().__init__()
        if hidden_dim % heads:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.head_dim = hidden_dim // heads
        self.num_features = num_features
        self.qkv = nn.Linear(hidden_dim, 3 * hidden_dim)
        self.out = nn.Linear(hidden_dim, hidden_dim)
        self.register_buffer("projection", orthogonal_gaussian(num_features, self.head_dim), persistent=True)

    @torch.no_grad()
    def redraw_projection(self, generator: torch.Generator | None = None) -> None:
        """Replace :attr:`projection` in place by a fresh draw from ``generator`` (a CPU generator)."""
        new = orthogonal_gaussian(self.num_features, self.head_dim, generator)
        self.projection.copy_(new.to(device=self.projection.device, dtype=self.projection.dtype))

    def _features(self, x: torch.Tensor, stabiliser: torch.Tensor) -> torch.Tensor:
        """``phi(x)``: ``x [N, h, d]`` (already scaled by d^-1/4), stabiliser ``[N, h, 1]`` -> ``[N, h, m]``."""
        proj = self.projection.to(x.dtype)
        logits = torch.einsum("nhd,md->nhm", x, proj)
        sq = 0.5 * x.square().sum(dim=-1, keepdim=True)
        return (torch.exp(logits - sq - stabiliser) + _EPS) / math.sqrt(self.num_features)

    def forward(self, h: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
        """Args: ``h [N, H]``, ``batch [N]`` graph of each node, ``num_graphs`` B. Returns ``[N, H]``."""
        n = h.shape[0]
        dtype = accumulate_dtype(h.dtype)
        q, k, v = self.qkv(h).to(dtype).chunk(3, dim=-1)
        scale = self.head_dim**-0.25
        q = q.reshape(n, self.heads, self.head_dim) * scale
        k = k.reshape(n, self.heads, self.head_dim) * scale
        v = v.reshape(n, self.heads, self.head_dim)
        proj = self.projection.to(dtype)
        with torch.no_grad():  # stabilisers: constants that cancel between numerator and denominator
            q_logits = torch.einsum("nhd,md->nhm", q, proj) - 0.5 * q.square().sum(dim=-1, keepdim=True)
            q_stab = q_logits.amax(dim=-1, keepdim=True)
            k_logits = torch.einsum("nhd,md->nhm", k, proj) - 0.5 * k.square().sum(dim=-1, keepdim=True)
            k_node = k_logits.amax(dim=-1)  # [N, h]
            k_graph = k_node.new_full((num_graphs, self.heads), float("-inf"))
            k_graph = k_graph.scatter_reduce(0, batch[:, None].expand(-1, self.heads), k_node, reduce="amax")
            k_stab = k_graph.index_select(0, batch).unsqueeze(-1)
        qf = self._features(q, q_stab)  # [N, h, m]
        kf = self._features(k, k_stab)
        kv = kf.new_zeros((num_graphs, self.heads, self.num_features, self.head_dim))
        kv = kv.index_add(0, batch, kf.unsqueeze(-1) * v.unsqueeze(-2))  # [B, h, m, d]
        ksum = kf.new_zeros((num_graphs, self.heads, self.num_features)).index_add(0, batch, kf)  # [B, h, m]
        num = torch.einsum("nhm,nhmd->nhd", qf, kv.index_select(0, batch))
        den = torch.einsum("nhm,nhm->nh", qf, ksum.index_select(0, batch)).unsqueeze(-1)
        att = (num / den).reshape(n, self.heads * self.head_dim).to(h.dtype)
        return self.out(att)


def redraw_projections(model: nn.Module, seed: int, count: int) -> int:
    """Redraw the projection of every :class:`PerformerAttention` in ``model``, deterministically.

    The draws come from one CPU generator seeded by ``(seed, count)``, consumed in module order,
    so every process (DDP rank) that calls this with the same arguments gets the same projections.

    Args:
        model: any module (a wrapper such as DDP is fine: its submodules are searched).
        seed: the run seed (``Training.seed``).
        count: the redraw number (1 for the first redraw, ...).

    Returns:
        The number of performer modules redrawn (0 for a model without performer attention).
    """
    generator = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(count)) % (2**63))
    redrawn = 0
    for module in model.modules():
        if isinstance(module, PerformerAttention):
            module.redraw_projection(generator)
            redrawn += 1
    return redrawn
