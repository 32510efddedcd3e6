"""Positional encodings for graph transformers (GPS): Laplacian eigenvectors and random walks.

:func:`add_positional_encodings` stores, for a prepared graph with ``N`` nodes:

* ``lap_pe [N, pe_dim]``: eigenvectors of the symmetric normalised Laplacian
  ``L = I - D^-1/2 A D^-1/2`` with the smallest eigenvalues, after the trivial first one,
  zero-padded when the graph has fewer than ``pe_dim + 1`` nodes. Each eigenvector is made
  sign-deterministic: its entry of largest magnitude (the first one, up to round-off) is
  positive. A model should still randomise the signs in training (GPS does).
* ``rw_pe [N, pe_dim]``: random-walk return probabilities ``diag((D^-1 A)^k)``, ``k = 1..pe_dim``.

``A`` is the binary adjacency of ``edge_index``: symmetrised, de-duplicated, periodic images of
the same pair merged into one edge, self-loops (and an atom's own periodic images) dropped.
Isolated nodes get ``L_ii = 1`` and zero return probabilities. Both come from one dense
float64 eigen-decomposition of ``L`` (``O(N^3)`` time, ``O(N^2)`` memory: about 0.5 s at 1k
nodes and 3 s at 2k on one CPU thread; meant for molecules and cells of up to a few thousand
atoms), stored as float32.
"""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from .errors import DataError

__all__ = ["add_positional_encodings", "laplacian_pe", "random_walk_pe"]

_SIGN_TOL = 1e-6
"""Relative tolerance when looking for an eigenvector's largest-magnitude entry (ties broken by
the first index, so symmetric graphs still get a deterministic sign)."""


def _adjacency(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Dense symmetric binary adjacency ``[N, N]`` (float64, zero diagonal)."""
    adj = torch.zeros(num_nodes, num_nodes, dtype=torch.float64)
    if edge_index.numel():
        src, dst = edge_index[0].long(), edge_index[1].long()
        adj[src, dst] = 1.0
        adj[dst, src] = 1.0
    adj.fill_diagonal_(0.0)
    return adj


def _check(edge_index: torch.Tensor, num_nodes: int, pe_dim: int, where: str) -> None:
    if isinstance(pe_dim, bool) or not isinstance(pe_dim, int) or pe_dim < 1:
        raise DataError(f"{where}: pe_dim must be a positive int, found {pe_dim!r}")
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        shape = tuple(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index).__name__
        raise DataError(f"{where}: edge_index must be a [2, E] tensor, found {shape}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise DataError(f"{where}: edge_index must hold integer node indices, found dtype {edge_index.dtype}")
    if num_nodes < 1:
        raise DataError(f"{where}: the graph has no nodes")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise DataError(
            f"{where}: edge_index refers to nodes outside [0, {num_nodes}) "
            f"(found min {int(edge_index.min())}, max {int(edge_index.max())})"
        )


def _spectrum(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition of ``L = I - D^-1/2 A D^-1/2``: eigenvalues ``[N]`` ascending and
    eigenvectors ``[N, N]`` (columns), float64."""
    adj = _adjacency(edge_index, num_nodes)
    deg = adj.sum(dim=1)
    inv_sqrt = torch.where(deg > 0, deg.clamp(min=1.0).rsqrt(), torch.zeros_like(deg))
    lap = torch.eye(num_nodes, dtype=torch.float64) - inv_sqrt[:, None] * adj * inv_sqrt[None, :]
    return torch.linalg.eigh(lap)


def _laplacian_columns(vecs: torch.Tensor, pe_dim: int) -> torch.Tensor:
    """Eigenvectors 1..pe_dim, sign-normalised, zero-padded: ``[N, N] -> [N, pe_dim]``."""
    num_nodes = vecs.shape[0]
    vecs = vecs[:, 1 : pe_dim + 1]
    if vecs.shape[1]:
        mag = vecs.abs()
        first_max = (mag >= mag.max(dim=0, keepdim=True).values * (1.0 - _SIGN_TOL)).to(torch.int64).argmax(dim=0)
        sign = torch.sign(vecs.gather(0, first_max[None, :]))
        vecs = vecs * torch.where(sign == 0, torch.ones_like(sign), sign)
    out = torch.zeros(num_nodes, pe_dim, dtype=torch.float64)
    out[:, : vecs.shape[1]] = vecs
    return out


def _return_probabilities(vals: torch.Tensor, vecs: torch.Tensor, pe_dim: int) -> torch.Tensor:
    """``diag((D^-1 A)^k)``, k = 1..pe_dim, from the spectrum of L: ``D^-1 A`` is similar to
    ``S = I - L`` (``D^-1 A = D^-1/2 S D^1/2``), so ``diag(P^k) = sum_j U_ij^2 (1 - mu_j)^k``."""
    lam = 1.0 - vals  # eigenvalues of S, in [-1, 1]
    powers = lam[None, :] ** torch.arange(1, pe_dim + 1, dtype=torch.float64)[:, None]  # [K, N]
    return vecs.square() @ powers.T  # [N, K]


def laplacian_pe(edge_index: torch.Tensor, num_nodes: int, pe_dim: int) -> torch.Tensor:
    """Laplacian eigenvector encodings.

    Args:
        edge_index: ``[2, E]`` integer edges (any direction, duplicates allowed).
        num_nodes: N.
        pe_dim: number of eigenvectors after the trivial one.

    Returns:
        ``[N, pe_dim]`` float64: eigenvectors 1..pe_dim of ``I - D^-1/2 A D^-1/2`` (ascending
        eigenvalues), sign-normalised (largest-magnitude entry positive), zero columns beyond N-1.

    Raises:
        DataError: on a malformed ``edge_index`` or a non-positive ``pe_dim``.
    """
    _check(edge_index, num_nodes, pe_dim, "laplacian_pe")
    _, vecs = _spectrum(edge_index, num_nodes)
    return _laplacian_columns(vecs, pe_dim)


def random_walk_pe(edge_index: torch.Tensor, num_nodes: int, pe_dim: int) -> torch.Tensor:
    """Random-walk return probabilities.

    Args:
        edge_index: ``[2, E]`` integer edges; num_nodes: N; pe_dim: the number of steps K.

    Returns:
        ``[N, pe_dim]`` float64: column ``k - 1`` is ``diag((D^-1 A)^k)``; isolated nodes get 0.

    Raises:
        DataError: on a malformed ``edge_index`` or a non-positive ``pe_dim``.
    """
    _check(edge_index, num_nodes, pe_dim, "random_walk_pe")
    vals, vecs = _spectrum(edge_index, num_nodes)
    return _return_probabilities(vals, vecs, pe_dim)


def add_positional_encodings(data: Data, pe_dim: int) -> Data:
    """A copy of a prepared graph with ``lap_pe`` and ``rw_pe`` ``[N, pe_dim]`` (float32).

    Args:
        data: a graph with ``edge_index [2, E]`` (build edges first, e.g. with ``add_edges``).
        pe_dim: positive number of encodings of each kind (``Architecture.pe_dim``).

    Returns:
        A new ``Data`` (``data`` is not modified).

    Raises:
        DataError: when ``data`` has no ``edge_index`` or nodes, or ``pe_dim`` is not a positive int.
    """
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None:
        raise DataError(
            "add_positional_encodings: the graph has no 'edge_index'; build its edges first "
            "(hydragnn.data.add_edges(data, cutoff))"
        )
    num_nodes = data.num_nodes
    if num_nodes is None:
        raise DataError("add_positional_encodings: cannot tell the number of nodes (no 'x', 'pos' or num_nodes)")
    _check(edge_index, int(num_nodes), pe_dim, "add_positional_encodings")
    vals, vecs = _spectrum(edge_index, int(num_nodes))
    out = data.clone()
    out.lap_pe = _laplacian_columns(vecs, pe_dim).to(torch.float32)
    out.rw_pe = _return_probabilities(vals, vecs, pe_dim).to(torch.float32)
    return out
