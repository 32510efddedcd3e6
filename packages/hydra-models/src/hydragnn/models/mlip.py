"""Interatomic-potential pieces: per-atom energy head, strain for the stress, autograd forces,
dynamic graph construction.

Conventions (ASE's): forces ``F = -dE/dpos`` in eV/Å; stress ``sigma = (1/V) dE/d(epsilon)``
in eV/Å³ for a symmetric strain ``epsilon`` applied as ``pos -> pos (I + epsilon)`` (row
vectors), ``cell -> cell (I + epsilon)`` and ``edge_shift -> edge_shift (I + epsilon)``.
Voigt order ``(xx, yy, zz, yz, xz, xy)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from .encoders import GraphInputs
from .energy_heads import EnergyHeadSpec
from .errors import ModelError
from .heads import NodeHead
from .heads_config import NodeHeadConfig
from .nn.scatter import accumulate_dtype, scatter_sum
from .nn.zbl import ZBLRepulsion

VOIGT_ROWS = (0, 1, 2, 1, 0, 0)
VOIGT_COLS = (0, 1, 2, 2, 2, 1)


def _reference_table(pairs: Sequence[tuple[int, float]] | None, size: int) -> torch.Tensor:
    table = torch.zeros(size, dtype=torch.get_default_dtype())
    for z, e in pairs or ():
        table[z] = e
    return table


class EnergyHead(nn.Module):
    """Energy as a sum of per-atom energies ``reference[Z] + shift + scale * head(h)``, with one
    readout (and its own reference, shift and scale) per energy head.

    One head keeps the single-readout layout (``atom`` with one output, ``reference [Zmax+1]``).
    ``K`` heads: ``atom`` has ``K`` outputs and ``reference`` is ``[K, Zmax+1]``; each structure
    uses the column of its ``head`` index (the default head when the batch has none): a gather
    with a static shape, so the capture-safe path is unchanged.

    Args:
        hidden_dim: width H of the node embedding.
        config: node head layout (``mlp`` or ``conv``) for the per-atom energy.
        activation: activation name.
        cutoff: radius for the ``conv`` head.
        heads: one :class:`~hydragnn.models.energy_heads.EnergyHeadSpec` per head, with its
            reference energies (``(Z, eV)`` pairs or ``None``), shift and scale filled in
            (:meth:`~hydragnn.models.config_groups.MLIPConfig.head_specs`).
        trainable_reference: learn the reference energies.
        layer_readouts: number of earlier conv layers read out linearly (``num_conv_layers - 1``
            with ``energy_layer_readout``, else 0): ``layers.i`` maps layer i's invariant
            features ``[N, H]`` to ``[N, K]``, added to the head's output before the scale.
        zbl: add the ZBL repulsion (:class:`~hydragnn.models.nn.zbl.ZBLRepulsion`, eV) to every
            atom's energy, after the reference, shift and scale (the same for every head).
    """

    shifts: torch.Tensor  # buffers of K > 1 heads
    scales: torch.Tensor

    def __init__(
        self,
        hidden_dim: int,
        config: NodeHeadConfig,
        activation: str,
        cutoff: float | None,
        heads: Sequence[EnergyHeadSpec],
        trainable_reference: bool = False,
        layer_readouts: int = 0,
        zbl: bool = False,
    ) -> None:
        super().__init__()
        self.names = [h.name for h in heads]
        self.default_head = 0
        self.atom = NodeHead(hidden_dim, len(heads), config, activation, cutoff)
        self.layers = (
            nn.ModuleList(nn.Linear(hidden_dim, len(heads), bias=False) for _ in range(layer_readouts))
            if layer_readouts
            else None
        )
        self.repulsion = ZBLRepulsion() if zbl else None
        tables = [h.reference_energies for h in heads]
        self.reference: torch.Tensor | None
        if not any(tables):
            self.reference = None
        else:
            size = max(z for t in tables if t for z, _ in t) + 1
            rows = [_reference_table(t, size) for t in tables]
            table = rows[0] if len(rows) == 1 else torch.stack(rows)
            if trainable_reference:
                self.reference = nn.Parameter(table)
            else:
                self.register_buffer("reference", table)
        shift, scale = cast(float, heads[0].energy_shift), cast(float, heads[0].energy_scale)  # filled in
        self.shift, self.scale = float(shift), float(scale)
        self.multi = len(heads) > 1
        if self.multi:  # per-head constants of the config (not weights: not in the state dict)
            self.register_buffer("shifts", torch.tensor([h.energy_shift for h in heads]), persistent=False)
            self.register_buffer("scales", torch.tensor([h.energy_scale for h in heads]), persistent=False)

    def _apply(self, fn, recurse=True):
        """Like ``nn.Module._apply`` but a 16-bit cast keeps the reference energies, shifts and
        scales in float32."""
        names = [n for n in ("reference", "shifts", "scales") if getattr(self, n, None) is not None]
        before = {n: getattr(self, n).detach().clone() for n in names}
        super()._apply(fn, recurse)
        for name, value in before.items():
            current = getattr(self, name)
            if current.dtype in (torch.bfloat16, torch.float16):
                kept = value.to(device=current.device, dtype=torch.float32)
                if isinstance(current, nn.Parameter):
                    current.data = kept
                else:
                    self._buffers[name] = kept
        return self

    def forward(
        self,
        h: torch.Tensor,
        inputs: GraphInputs,
        head: torch.Tensor | None = None,
        layers: Sequence[torch.Tensor] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-atom and total energies.

        Args:
            h: node embedding ``[N, H]``.
            inputs: the encoder inputs (``x[:, 0]`` is the atomic number when a reference is set).
            head: ``[B]`` int64 head of each structure (ignored with one head; default: the
                default head for every structure).
            layers: the earlier conv layers' invariant features ``[N, H]``, one per layer
                readout, in layer order (``inputs.layer_features`` without the last).

        Returns:
            ``atomic_energy [N, 1]`` and ``energy [B, 1]``, in float32 for 16-bit models
            (sums accumulate in float32), else in the model dtype.
        """
        acc = accumulate_dtype(h.dtype)
        out = self.atom(h, inputs)
        if self.layers is not None:
            if len(layers) != len(self.layers):
                raise ModelError(
                    f"energy_layer_readout: the head reads {len(self.layers)} earlier conv layers, "
                    f"the encoder reported {len(layers)}"
                )
            for readout, features in zip(self.layers, layers):
                out = out + readout(features)
        out = out.to(acc)
        species = inputs.x[:, 0].long() if self.reference is not None else None
        if not self.multi:
            atomic = out
            if self.scale != 1.0 or self.shift != 0.0:
                atomic = atomic * self.scale + self.shift
            if species is not None and self.reference is not None:  # (species: read with a reference)
                atomic = atomic + self.reference.to(acc).index_select(0, species).unsqueeze(-1)
        else:
            if head is None:
                head = torch.full((inputs.num_graphs,), self.default_head, dtype=torch.long, device=out.device)
            k = head.reshape(-1).long().index_select(0, inputs.batch)
            atomic = out.gather(1, k.unsqueeze(-1)) * self.scales.to(acc)[k].unsqueeze(-1)
            atomic = atomic + self.shifts.to(acc)[k].unsqueeze(-1)
            if species is not None and self.reference is not None:
                atomic = atomic + self.reference.to(acc)[k, species].unsqueeze(-1)
        if self.repulsion is not None:
            if inputs.edge_len is None:
                raise ModelError("zbl: the ZBL repulsion needs positions (GraphInputs.edge_len is None)")
            atomic = atomic + self.repulsion(inputs.x[:, 0].long(), inputs.edge_index, inputs.edge_len.to(acc))
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
    return (*strain(pos, batch, cell, edge_index, edge_shift, displacement), displacement)


def strain(
    pos: torch.Tensor,
    batch: torch.Tensor,
    cell: torch.Tensor | None,
    edge_index: torch.Tensor,
    edge_shift: torch.Tensor | None,
    displacement: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Positions, cells and image offsets under the symmetric part of ``displacement``
    (``[B, 3, 3]``); :func:`apply_strain` with a given displacement."""
    sym = 0.5 * (displacement + displacement.transpose(-1, -2))
    pos = pos + torch.einsum("ni,nij->nj", pos, sym.index_select(0, batch))
    if cell is not None:
        cell = cell + torch.bmm(cell, sym)
    if edge_shift is not None:
        edge_shift = edge_shift + torch.einsum(
            "ei,eij->ej", edge_shift, sym.index_select(0, batch.index_select(0, edge_index[1]))
        )
    return pos, cell, edge_shift


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
    batch: torch.Tensor | None,
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
