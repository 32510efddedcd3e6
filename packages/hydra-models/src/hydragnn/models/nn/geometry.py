"""NaN-safe geometry shared by the geometric encoders: edge lengths and directions, pair geometry.

Padding puts zero-length ``sink -> sink`` edges in a batch. ``sqrt`` has an infinite slope at
0 and ``vec / |vec|`` is 0/0 there, so lengths and unit vectors are computed behind guards:
finite values and zero gradients (first and second order) on zero-length edges, exact values
elsewhere. Everything here is capture-safe (no host synchronisation, no data-dependent shape).
"""

from __future__ import annotations

import torch

from .backends import Primitive
from .scatter import accumulate_dtype


def safe_norm(vec: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last axis with a finite gradient at zero.

    Args:
        vec: ``[E, 3]`` vectors (zero rows allowed: padded sink edges).

    Returns:
        ``[E]`` lengths; zero vectors give length 0 and gradient 0 (first and second order).
        Without a gradient to guard (grad mode off or ``vec`` not requiring one) the plain
        ``sqrt`` of the same sum: the same values in 3 operations instead of 8.
    """
    sq = (vec * vec).sum(dim=-1)
    if not (vec.requires_grad and torch.is_grad_enabled()):
        return sq.sqrt()
    nonzero = sq > 0
    safe = torch.where(nonzero, sq, torch.ones_like(sq))
    return torch.where(nonzero, safe.sqrt(), torch.zeros_like(sq))


def safe_unit_vectors(edge_vec: torch.Tensor, edge_len: torch.Tensor) -> torch.Tensor:
    """``vec / |vec|``, the zero vector on zero-length edges: ``[E, 3], [E] -> [E, 3]``."""
    positive = edge_len > 0
    denom = torch.where(positive, edge_len, torch.ones_like(edge_len))
    return edge_vec / denom.unsqueeze(-1)


DIRECTION_SMOOTHING = 1e-2
"""``delta`` (Å) of the smooth direction ``r / sqrt(|r|^2 + delta^2)``."""


def minimum_image(rel: torch.Tensor, batch: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor | None) -> torch.Tensor:
    """Minimum-image pair vectors along the periodic directions.

    ``r_ij - n_ij @ cell_g`` with ``n_ij = round(r_ij @ cell_g^-1)`` (no gradient) and ``g`` the
    graph of atom i; ``n_ij`` is 0 along non-periodic directions. Non-periodic rows are replaced
    by unit vectors before inverting, so a zero row (a molecule, the padding sink) gives no NaN;
    a singular *periodic* cell leaves the raw vectors unchanged. Capture-safe (``inv_ex``: no
    error check, no host synchronisation).

    Args:
        rel: ``[N, N, 3]`` raw pair vectors ``pos_j - pos_i``.
        batch: ``[N]`` graph index of each node.
        cell: ``[B, 3, 3]`` lattice vectors as rows (same dtype as ``rel``).
        pbc: ``[B, 3]`` periodic directions (bool), or ``None`` for periodic everywhere.

    Returns:
        ``[N, N, 3]`` pair vectors, differentiable in ``rel`` and ``cell``.
    """
    if pbc is None:
        periodic = torch.ones(cell.shape[0], 3, dtype=rel.dtype, device=rel.device)
    else:
        periodic = pbc.to(rel.dtype)
    eye = torch.eye(3, dtype=rel.dtype, device=rel.device)
    safe = torch.where(periodic.unsqueeze(-1) > 0, cell.detach(), eye)  # non-periodic rows -> unit vectors
    inv, info = torch.linalg.inv_ex(safe)  # [B, 3, 3]; info != 0: singular (no error check, no sync)
    invertible = (info == 0).unsqueeze(-1)  # [B, 1]
    inv = torch.where(invertible.unsqueeze(-1), inv, eye)
    periodic = periodic * invertible.to(rel.dtype)  # a singular periodic cell: no shifts
    frac = torch.einsum("ijc,icd->ijd", rel.detach(), inv.index_select(0, batch))  # [i, j, 3] fractional coordinates
    shift = torch.round(frac) * periodic.index_select(0, batch).unsqueeze(1)  # [N, N, 3]
    return rel - torch.einsum("ijk,ikc->ijc", shift, cell.index_select(0, batch))


def _geometry(
    rel: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype, cell: torch.Tensor | None, pbc: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dist`` and smooth ``unit`` of raw pair vectors ``rel [M, n, 3]`` whose row i belongs to graph ``rows[i]``."""
    if cell is not None:
        rel = minimum_image(rel, rows, cell.to(rel.dtype), pbc)
    dist = safe_norm(rel)
    unit = rel / torch.sqrt((rel * rel).sum(dim=-1, keepdim=True) + DIRECTION_SMOOTHING**2)
    return dist.to(dtype), unit.to(dtype)


def pair_geometry(
    pos: torch.Tensor,
    batch: torch.Tensor,
    dtype: torch.dtype,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All-pairs distances, smooth directions and the same-graph mask.

    Args:
        pos: ``[N, 3]`` positions (geometry is computed in float32 at least).
        batch: ``[N]`` graph index of each node.
        dtype: dtype of the returned distances and directions.
        cell: ``[B, 3, 3]`` lattice vectors as rows, or ``None`` (no periodicity).
        pbc: ``[B, 3]`` bool periodic directions (``None`` with a cell: periodic everywhere).

    Returns:
        ``dist [N, N]`` (``|r_ij|``, 0 on the diagonal, zero gradient there),
        ``unit [N, N, 3]`` (``r_ij / sqrt(|r_ij|^2 + delta^2)``, 0 for i == j) and
        ``same [N, N]`` bool (i and j in the same graph), with ``r_ij = pos_j - pos_i`` taken at
        the minimum image when ``cell`` is given (see :func:`minimum_image`).
    """
    pos = pos.to(accumulate_dtype(pos.dtype))
    rel = pos.unsqueeze(0) - pos.unsqueeze(1)  # [i, j, 3] = pos_j - pos_i
    dist, unit = _geometry(rel, batch, dtype, cell, pbc)
    return dist, unit, batch.unsqueeze(0) == batch.unsqueeze(1)


def dense_pair_geometry(
    pos: torch.Tensor,
    valid: torch.Tensor,
    dtype: torch.dtype,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`pair_geometry` on a per-graph layout: ``pos [B, n, 3]``, ``valid [B, n]`` ->
    ``dist [B, n, n]``, ``unit [B, n, n, 3]`` and ``same [B, n, n]`` (both slots real)."""
    b, n, _ = pos.shape
    pos = pos.to(accumulate_dtype(pos.dtype))
    rel = (pos.unsqueeze(1) - pos.unsqueeze(2)).reshape(b * n, n, 3)  # [b, i, j] = pos_j - pos_i
    rows = torch.arange(b, device=pos.device).repeat_interleave(n)
    dist, unit = _geometry(rel, rows, dtype, cell, pbc)
    return dist.view(b, n, n), unit.view(b, n, n, 3), valid.unsqueeze(2) & valid.unsqueeze(1)


class TripletRows(Primitive):
    """Where DimeNet's spherical basis of the triplets ``k -> j -> i`` is evaluated.

    ``forward(dist [E], cos_angle [T], idx_kj [T]) -> (rad_at [D], rad_index [Q], cos_at [Q],
    expand [T] or None)``: the radial part is evaluated at the lengths ``rad_at`` and the angular
    part at ``cos_at``; row ``q`` of the basis pairs radial row ``rad_index[q]`` with angular row
    ``q``, and triplet ``t`` takes row ``expand[t]`` (row ``t`` when ``expand`` is None). The stock
    forward is one row per triplet: ``(dist, idx_kj, cos_angle, None)``; the default ``"distinct"``
    implementation (:mod:`.distinct`) one row per distinct ``(d_kj, cos angle)`` pair.
    Parameter-free.
    """

    def forward(  # type: ignore[override]
        self, dist: torch.Tensor, cos_angle: torch.Tensor, idx_kj: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return dist, idx_kj, cos_angle, None
