"""Interatomic-potential pieces: per-atom energy head, strain for the stress, autograd forces,
dynamic graph construction.

Conventions (ASE's): forces ``F = -dE/dpos`` in eV/Å; stress ``sigma = (1/V) dE/d(epsilon)``
in eV/Å³ for a symmetric strain ``epsilon`` applied as ``pos -> pos (I + epsilon)`` (row
vectors), ``cell -> cell (I + epsilon)`` and ``edge_shift -> edge_shift (I + epsilon)``.
Voigt order ``(xx, yy, zz, yz, xz, xy)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .encoders import GraphInputs
from .errors import ModelError
from .heads import NodeHead
from .heads_config import NodeHeadConfig
from .ops import accumulate_dtype, scatter_sum

VOIGT_ROWS = (0, 1, 2, 1, 0, 0)
VOIGT_COLS = (0, 1, 2, 2, 2, 1)


class EnergyHead(nn.Module):
    """Energy as a sum of per-atom energies plus an optional per-species reference.

    Args:
        hidden_dim: width H of the node embedding.
        config: node head layout (``mlp`` or ``conv``) for the per-atom energy.
        activation: activation name.
        cutoff: radius for the ``conv`` head.
        reference_energies: ``(atomic number, energy)`` pairs, or ``None``.
        trainable_reference: learn the reference energies.
    """

    def __init__(
        self,
        hidden_dim: int,
        config: NodeHeadConfig,
        activation: str,
        cutoff: float | None,
        reference_energies: Sequence[tuple[int, float]] | None,
        trainable_reference: bool = False,
    ) -> None:
        super().__init__()
        self.atom = NodeHead(hidden_dim, 1, config, activation, cutoff)
        self.reference: torch.Tensor | None
        if reference_energies:
            table = torch.zeros(max(z for z, _ in reference_energies) + 1, dtype=torch.get_default_dtype())
            for z, e in reference_energies:
                table[z] = e
            if trainable_reference:
                self.reference = nn.Parameter(table)
            else:
                self.register_buffer("reference", table)
        else:
            self.reference = None

    def _apply(self, fn, recurse=True):
        """Like ``nn.Module._apply`` but a 16-bit cast keeps the reference energies in float32."""
        before = self.reference.detach().clone() if self.reference is not None else None
        super()._apply(fn, recurse)
        if before is not None and self.reference.dtype in (torch.bfloat16, torch.float16):
            kept = before.to(device=self.reference.device, dtype=torch.float32)
            if isinstance(self.reference, nn.Parameter):
                self.reference.data = kept
            else:
                self._buffers["reference"] = kept
        return self

    def forward(self, h: torch.Tensor, inputs: GraphInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-atom and total energies.

        Args:
            h: node embedding ``[N, H]``.
            inputs: the encoder inputs (``x[:, 0]`` is the atomic number when a reference is set).

        Returns:
            ``atomic_energy [N, 1]`` and ``energy [B, 1]``, in float32 for 16-bit models
            (sums accumulate in float32), else in the model dtype.
        """
        acc = accumulate_dtype(h.dtype)
        atomic = self.atom(h, inputs).to(acc)
        if self.reference is not None:
            species = inputs.x[:, 0].long()
            atomic = atomic + self.reference.to(acc)[species].unsqueeze(-1)
        energy = scatter_sum(atomic, inputs.batch, inputs.num_graphs)
        return atomic, energy


def apply_strain(
    pos: torch.Tensor,
    batch: torch.Tensor,
    num_graphs: int,
    cell: torch.Tensor | None,
    edge_index: torch.Tensor,
    edge_shift: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """Apply a zero symmetric strain whose gradient gives the stress.

    Args:
        pos: ``[N, 3]`` positions.
        batch: ``[N]`` graph of each node.
        num_graphs: B.
        cell: ``[B, 3, 3]`` lattice vectors as rows, or ``None``.
        edge_index: ``[2, E]``.
        edge_shift: ``[E, 3]`` Cartesian image offsets, or ``None``.

    Returns:
        Strained ``pos [N, 3]``, ``cell [B, 3, 3]``, ``edge_shift [E, 3]`` (numerically
        unchanged) and the displacement ``[B, 3, 3]`` (zeros, requires grad).
    """
    displacement = torch.zeros(num_graphs, 3, 3, dtype=pos.dtype, device=pos.device, requires_grad=True)
    sym = 0.5 * (displacement + displacement.transpose(-1, -2))
    pos = pos + torch.einsum("ni,nij->nj", pos, sym[batch])
    if cell is not None:
        cell = cell + torch.bmm(cell, sym)
    if edge_shift is not None:
        edge_shift = edge_shift + torch.einsum("ei,eij->ej", edge_shift, sym[batch[edge_index[1]]])
    return pos, cell, edge_shift, displacement


def stress_from_virial(dE_dstrain: torch.Tensor, cell: torch.Tensor, dim: int = 6) -> torch.Tensor:
    """``(1/V) dE/d(epsilon)``; graphs without a volume (no cell) get 0.

    Args:
        dE_dstrain: ``[B, 3, 3]``.
        cell: ``[B, 3, 3]`` unstrained lattice vectors as rows.
        dim: 6 (Voigt ``xx, yy, zz, yz, xz, xy``) or 9 (row-major 3x3).

    Returns:
        ``[B, dim]`` stress in energy units per cubic length unit.
    """
    volume = torch.linalg.det(cell.detach().to(dE_dstrain.dtype)).abs()
    has_volume = volume > 0
    safe = torch.where(has_volume, volume, torch.ones_like(volume))
    stress = dE_dstrain / safe.view(-1, 1, 1) * has_volume.to(dE_dstrain.dtype).view(-1, 1, 1)
    if dim == 9:
        return stress.reshape(-1, 9)
    return stress[:, VOIGT_ROWS, VOIGT_COLS]


def derivatives(
    energy: torch.Tensor,
    pos: torch.Tensor,
    displacement: torch.Tensor | None,
    create_graph: bool,
    retain_graph: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``-dE/dpos`` and ``dE/d(strain)`` by one autograd call.

    Args:
        energy: ``[B, 1]`` energies.
        pos: ``[N, 3]`` positions the energy was computed from (requires grad).
        displacement: ``[B, 3, 3]`` strain from :func:`apply_strain`, or ``None``.
        create_graph: make the derivatives differentiable (training on forces).
        retain_graph: keep the energy's graph (default: ``create_graph``).

    Returns:
        forces ``[N, 3]`` and ``dE/d(strain) [B, 3, 3]`` (or ``None``); zeros where the energy
        does not depend on the input.
    """
    wrt = [pos] if displacement is None else [pos, displacement]
    if not energy.requires_grad:
        grads: Sequence[torch.Tensor | None] = [None] * len(wrt)
    else:
        grads = torch.autograd.grad(
            energy.sum(),
            wrt,
            create_graph=create_graph,
            retain_graph=create_graph if retain_graph is None else retain_graph or create_graph,
            allow_unused=True,
        )
    forces = -grads[0] if grads[0] is not None else torch.zeros_like(pos)
    virial = None
    if displacement is not None:
        virial = grads[1] if grads[1] is not None else torch.zeros_like(displacement)
    return forces, virial


def dynamic_edges(
    pos: torch.Tensor,
    radius: float,
    batch: torch.Tensor,
    cell: torch.Tensor | None,
    pbc: torch.Tensor | None,
    max_neighbours: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Edges within ``radius`` from positions (not capture-safe: the edge count is data-dependent).

    Returns:
        ``edge_index [2, E]`` and ``edge_shift [E, 3]`` (Cartesian) from
        :func:`hydragnn.data.neighbors.radius_graph`.

    Raises:
        ModelError: when hydra-data has no neighbor-list module.
    """
    try:
        from hydragnn.data.neighbors import radius_graph
    except ImportError as exc:  # pragma: no cover - depends on the installed hydra-data
        raise ModelError(
            "dynamic graph construction needs hydragnn.data.neighbors.radius_graph "
            f"(a hydra-data with neighbor lists); import failed: {exc}"
        ) from exc
    edge_index, edge_shift = radius_graph(
        pos.detach(), radius, batch=batch, cell=cell, pbc=pbc, max_neighbours=max_neighbours
    )
    return edge_index, (edge_shift.to(pos.dtype) if edge_shift is not None else None)
