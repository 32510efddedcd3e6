"""Edge-pair (triplet) lists for angular message passing (DimeNet), in plain torch.

A triplet ``(kj, ji)`` pairs an edge ``k -> j`` (``edge_index[:, kj] = (k, j)``) with an edge
``j -> i`` that starts where the first one ends, so that the angle at ``j`` between the
neighbours ``k`` and ``i`` is defined. Backtracking pairs, where ``k -> j -> i`` goes back to
the very atom it came from (``k == i`` *and* the same periodic image), are excluded. In a
periodic cell ``k == i`` can also be a different image of ``i`` (a small cell): that triplet
is kept, which is why the test looks at the edge vectors and not only at the node indices.

Two builders:

* :func:`build_triplets` returns the exact list. Its length depends on the data (a
  ``repeat_interleave`` over in-degrees and a boolean mask): it is **not** capture-safe.
  Ordering matches torch-sparse's ``SparseTensor`` construction used by PyG's DimeNet: by
  ``ji``, then by source ``k`` (then by edge id).
* :func:`build_triplets_padded` returns a fixed-size ``E * capacity`` layout with a 0/1
  weight per slot. Its shapes depend only on ``E`` and ``capacity`` (no host sync, no boolean
  indexing): it is capture-safe. A node with more than ``capacity`` incoming edges loses the
  extra triplets (only the first ``capacity`` incoming edges by source index are kept); check
  with :func:`max_in_degree` outside the captured region.

Conventions: ``edge_index[0]`` is the source, ``edge_index[1]`` the target, and
``edge_vec[e] = pos[src] - pos[dst] + shift`` (from the target to the source image).
"""

from __future__ import annotations

import torch

#: Backtracking test: ``|vec_kj + vec_ji| <= rel_tol * (|vec_kj| + |vec_ji|)`` (with ``k == i``).
#: A different periodic image of ``i`` is at least a lattice vector away, far above this.
_REL_TOL_FINE = 1e-3
_REL_TOL_COARSE = 5e-2  # bf16 / fp16 edge vectors carry ~3 significant digits


def _backtracking(
    edge_index: torch.Tensor, edge_vec: torch.Tensor | None, idx_kj: torch.Tensor, idx_ji: torch.Tensor
) -> torch.Tensor:
    """Bool ``[T]``: the pair ``(kj, ji)`` returns to the atom it started from (same image)."""
    same_node = edge_index[0, idx_kj] == edge_index[1, idx_ji]
    if edge_vec is None:
        return same_node
    v_kj = edge_vec.index_select(0, idx_kj).detach()
    v_ji = edge_vec.index_select(0, idx_ji).detach()
    rel_tol = _REL_TOL_FINE if torch.finfo(edge_vec.dtype).eps < 1e-4 else _REL_TOL_COARSE
    gap = torch.linalg.vector_norm(v_kj + v_ji, dim=-1)
    scale = torch.linalg.vector_norm(v_kj, dim=-1) + torch.linalg.vector_norm(v_ji, dim=-1)
    return same_node & (gap <= rel_tol * scale)


def _sorted_by_target(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Edges sorted by (target, source), the in-degree and the CSR start of every node."""
    src, dst = edge_index[0], edge_index[1]
    order = torch.argsort(dst * max(num_nodes, 1) + src, stable=True)
    in_degree = torch.zeros(num_nodes, dtype=torch.long, device=src.device)
    in_degree.scatter_add_(0, dst, torch.ones_like(dst))
    start = torch.cumsum(in_degree, 0) - in_degree
    return order, in_degree, start


def build_triplets(
    edge_index: torch.Tensor, num_nodes: int, edge_vec: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every non-backtracking edge pair ``(k -> j, j -> i)``. Data-dependent length: not capture-safe.

    Args:
        edge_index: ``[2, E]`` int64, row 0 the source, row 1 the target.
        num_nodes: N.
        edge_vec: ``[E, 3]`` edge vectors (with periodic shifts), or ``None``. With vectors, a
            pair with ``k == i`` is excluded only when it returns to the same image of ``i``;
            without them, every ``k == i`` pair is excluded (PyG's rule, exact without periodicity).

    Returns:
        ``(idx_kj, idx_ji)``, each ``[T]`` int64 edge ids.
    """
    src = edge_index[0]
    num_edges = src.shape[0]
    order, in_degree, start = _sorted_by_target(edge_index, num_nodes)
    per_edge = in_degree.index_select(0, src)  # edges ending at j = src of ji
    idx_ji = torch.repeat_interleave(torch.arange(num_edges, device=src.device), per_edge)
    first = torch.cumsum(per_edge, 0) - per_edge
    offset = torch.arange(idx_ji.shape[0], device=src.device) - first.index_select(0, idx_ji)
    idx_kj = order.index_select(0, start.index_select(0, src.index_select(0, idx_ji)) + offset)
    keep = ~_backtracking(edge_index, edge_vec, idx_kj, idx_ji)
    return idx_kj[keep], idx_ji[keep]


def build_triplets_padded(
    edge_index: torch.Tensor, num_nodes: int, capacity: int, edge_vec: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed-size triplet slots ``[E * capacity]`` with a 0/1 weight: capture-safe.

    Slot ``e * capacity + r`` pairs edge ``e = ji`` with the ``r``-th edge ending at ``j``
    (sorted by source). Empty slots, backtracking pairs and incoming edges beyond ``capacity``
    get weight 0 (their indices point at a valid edge, so gathers stay in range).

    Args:
        edge_index: ``[2, E]`` int64.
        num_nodes: N.
        capacity: slots per edge; at least the largest in-degree for an exact result.
        edge_vec: ``[E, 3]`` edge vectors for the periodic backtracking test, or ``None``.

    Returns:
        ``(idx_kj [E*capacity], idx_ji [E*capacity], weight [E*capacity] bool)``.
    """
    src, dst = edge_index[0], edge_index[1]
    device = src.device
    num_edges = src.shape[0]
    order, _, start = _sorted_by_target(edge_index, num_nodes)
    rank_sorted = torch.arange(num_edges, device=device) - start[dst[order]]
    rank = torch.empty_like(rank_sorted).scatter_(0, order, rank_sorted)
    trash = num_nodes * capacity
    slot = torch.where(rank < capacity, dst * capacity + rank, torch.full_like(rank, trash))
    table = torch.full((trash + 1,), num_edges, dtype=torch.long, device=device)
    table.scatter_(0, slot, torch.arange(num_edges, device=device))
    columns = torch.arange(capacity, device=device)
    idx_kj = table[(src * capacity).unsqueeze(1) + columns].reshape(-1)  # [E*cap]
    idx_ji = torch.arange(num_edges, device=device).unsqueeze(1).expand(num_edges, capacity).reshape(-1)
    valid = idx_kj < num_edges
    idx_kj = torch.where(valid, idx_kj, torch.zeros_like(idx_kj))
    weight = valid & ~_backtracking(edge_index, edge_vec, idx_kj, idx_ji)
    return idx_kj, idx_ji, weight


def max_in_degree(edge_index: torch.Tensor, num_nodes: int) -> int:
    """The largest number of edges ending at one node (host sync: call it outside a capture)."""
    if edge_index.shape[1] == 0:
        return 0
    in_degree = torch.zeros(num_nodes, dtype=torch.long, device=edge_index.device)
    in_degree.scatter_add_(0, edge_index[1], torch.ones_like(edge_index[1]))
    return int(in_degree.max().item())
