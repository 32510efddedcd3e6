"""NaN-safe edge geometry shared by the geometric encoders written against :class:`GraphInputs`.

Padding puts zero-length ``sink -> sink`` edges in a batch. ``sqrt`` has an infinite slope at
0 and ``vec / |vec|`` is 0/0 there, so lengths and unit vectors are computed behind guards:
finite values and zero gradients on zero-length edges, exact values elsewhere.
"""

from __future__ import annotations

import torch


def safe_edge_length(edge_vec: torch.Tensor) -> torch.Tensor:
    """``|vec|``, 0 with a zero gradient on zero-length edges: ``[E, 3] -> [E]``."""
    sq = (edge_vec * edge_vec).sum(dim=-1)
    positive = sq > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, sq, torch.ones_like(sq))), torch.zeros_like(sq))


def safe_unit_vectors(edge_vec: torch.Tensor, edge_len: torch.Tensor) -> torch.Tensor:
    """``vec / |vec|``, the zero vector on zero-length edges: ``[E, 3], [E] -> [E, 3]``."""
    positive = edge_len > 0
    denom = torch.where(positive, edge_len, torch.ones_like(edge_len))
    return edge_vec / denom.unsqueeze(-1)
