"""Smooth degrees: the envelope-weighted in-degree and the C1 step the degree-aware convolutions
(:mod:`.sage`, :mod:`.mfc`) are built from."""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

from torch import Tensor
from torch_geometric.utils import scatter


def soft_degree(env: Tensor, target: Tensor, num_nodes: int) -> Tensor:
    """Envelope-weighted in-degree ``d_i = sum_j env_ij``: ``[E, 1] -> [N, 1]``.

    Unlike the edge count it changes smoothly when a neighbour crosses the cutoff.
    """
    return scatter(env, target, dim=0, dim_size=num_nodes, reduce="sum")


def smoothstep(u: Tensor) -> Tensor:
    """``3u^2 - 2u^3`` on ``[0, 1]`` (C1: zero slope at both ends)."""
    u = u.clamp(0.0, 1.0)
    return u * u * (3.0 - 2.0 * u)
