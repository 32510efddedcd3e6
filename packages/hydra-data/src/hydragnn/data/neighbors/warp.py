"""nvalchemi-toolkit-ops' batched neighbour searches through its core Warp launchers, on torch buffers.

:func:`hydragnn.data.neighbors.radius_graph` takes its candidate pairs from nvalchemi's batched
naive (O(N^2)) and cell-list (O(N)) searches. They are called here through the Warp-level API,
``nvalchemiops.neighbors`` (launchers taking ``wp.array``), on tensors that torch allocates and
Warp views with ``wp.from_torch``: importing the torch adapters instead
(``nvalchemiops.torch.neighbors``) runs ``nvalchemiops/torch/__init__.py``, which defines the
FIRE2 / L-BFGS optimiser and integrator kernels too, about 2 s more at the first call of a
process for kernels a neighbour search never uses.

The buffers and launch arguments mirror the adapters ``batch_naive_neighbor_list`` and
``batch_cell_list`` of nvalchemi-toolkit-ops 0.5 for the only options used here: full rows (not
half), the periodic launch with per-graph ``pbc`` flags (``False`` rows are searched without
images), positions wrapped by the kernel, no pair outputs, and on CUDA the adapter's automatic
choice between the atom- and pair-centric cell-list queries. So the pairs found are the
adapters'. Every launch runs on the device of the positions and, on CUDA, on torch's current
stream; every buffer, scratch included, is a torch tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .warp_import import nvalchemi_core_neighbors

#: Fewest cells per periodic direction of the cell-list grid (the adapter's default).
MIN_CELLS_PER_DIMENSION = 4

Search = Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _on_torch_stream(wp, device: torch.device):
    """Context binding Warp launches to torch's current CUDA stream (nothing to do on CPU)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    stream = torch.cuda.current_stream(device)
    if wp.get_stream(str(device)).cuda_stream == stream.cuda_stream:
        return contextlib.nullcontext()
    return wp.ScopedStream(wp.stream_from_torch(stream), sync_enter=False)


@dataclass
class _Launch:
    """What every launch of one search shares: the modules, the device and the common arguments."""

    nv: Any
    wp: Any
    pos: torch.Tensor
    cell: torch.Tensor
    common: dict[str, Any]

    @property
    def device(self) -> torch.device:
        return self.pos.device

    def ints(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.int32, device=self.device)

    def view(self, tensor: torch.Tensor, dtype):
        return self.wp.from_torch(tensor, dtype=dtype, requires_grad=False)

    def stream(self):
        return _on_torch_stream(self.wp, self.device)

    def outputs(self, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The neighbour matrix (padded with ``N``), counts and shifts, and their Warp views."""
        n = self.pos.shape[0]
        matrix = torch.full((n, width), n, dtype=torch.int32, device=self.device)
        num, shifts = self.ints(n), self.ints(n, width, 3)
        views = {
            "neighbor_matrix": self.view(matrix, self.wp.int32),
            "neighbor_matrix_shifts": self.view(shifts, self.wp.vec3i),
            "num_neighbors": self.view(num, self.wp.int32),
        }
        return matrix, num, shifts, views


def neighbour_search(
    pos: torch.Tensor,
    cell: torch.Tensor,
    pbc: torch.Tensor,
    batch_idx: torch.Tensor,
    batch_ptr: torch.Tensor,
    cutoff: float,
    max_atoms: int,
    cell_list: bool,
) -> Search:
    """Prepare a batched search; the result runs it for a neighbour-matrix width.

    Args:
        pos: ``[N, 3]`` float32/float64 contiguous positions.
        cell: ``[B, 3, 3]`` non-singular cells in the dtype of ``pos`` (rows are lattice vectors).
        pbc: ``[B, 3]`` bool periodic flags.
        batch_idx: ``[N]`` int32 sorted graph index of each atom (every graph has atoms).
        batch_ptr: ``[B + 1]`` int32 first atom of each graph.
        cutoff: Search radius.
        max_atoms: Atoms of the largest graph.
        cell_list: Use the cell list (built once here) instead of the naive search.

    Returns:
        ``search(width) -> (matrix [N, width], num [N], shifts [N, width, 3])``, all int32: row
        ``i`` holds the neighbours ``j`` of atom ``i`` in its first ``min(num[i], width)`` slots
        with their integer image shifts; ``num`` counts every neighbour, also those that did
        not fit.
    """
    nv = nvalchemi_core_neighbors()  # slow import: lazy
    import warp as wp  # loaded by the line above

    scalar, vec, mat = {
        torch.float32: (wp.float32, wp.vec3f, wp.mat33f),
        torch.float64: (wp.float64, wp.vec3d, wp.mat33d),
    }[pos.dtype]
    launch = _Launch(nv, wp, pos, cell, {})
    launch.common.update(
        positions=launch.view(pos, vec),
        cell=launch.view(cell, mat),
        pbc=launch.view(pbc, wp.bool),
        cutoff=cutoff,
        batch_idx=launch.view(batch_idx, wp.int32),
        wp_dtype=scalar,
        device=str(pos.device),
    )
    if cell_list:
        return _cell_list_search(launch, scalar, vec)
    return _naive_search(launch, batch_ptr, max_atoms, scalar, vec, mat)


def _naive_search(launch: _Launch, batch_ptr: torch.Tensor, max_atoms: int, scalar, vec, mat) -> Search:
    """The naive O(N^2) search over the periodic images each graph's cell needs."""
    nv, wp, common, view = launch.nv, launch.wp, launch.common, launch.view
    b, n = launch.cell.shape[0], launch.pos.shape[0]
    shift_range, num_shifts = launch.ints(b, 3), launch.ints(b)
    with launch.stream():
        nv.compute_naive_num_shifts(
            cell=common["cell"],
            cutoff=common["cutoff"],
            pbc=common["pbc"],
            num_shifts=view(num_shifts, wp.int32),
            shift_range=view(shift_range, wp.vec3i),
            wp_dtype=scalar,
            device=common["device"],
        )
    images = {
        "batch_ptr": view(batch_ptr, wp.int32),
        "shift_range": view(shift_range, wp.vec3i),
        "num_shifts_arr": view(num_shifts, wp.int32),
        "max_shifts_per_system": int(num_shifts.max()),
        "max_atoms_per_system": int(max_atoms),
    }
    scratch = (torch.empty_like(launch.pos), launch.ints(n, 3), torch.empty_like(launch.cell))

    def naive(width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        matrix, num, shifts, out = launch.outputs(width)
        with launch.stream():
            nv.batch_naive_neighbor_matrix_pbc(
                **common,
                **images,
                **out,
                positions_wrapped_buffer=view(scratch[0], vec),
                per_atom_cell_offsets_buffer=view(scratch[1], wp.vec3i),
                inv_cell_buffer=view(scratch[2], mat),
            )
        return matrix, num, shifts

    return naive


def _cell_list_search(launch: _Launch, scalar, vec) -> Search:
    """The cell list: built once here (grid sized per graph), queried for each width."""
    nv, wp, common, view, ints = launch.nv, launch.wp, launch.common, launch.view, launch.ints
    b, n, device, wp_device = launch.cell.shape[0], launch.pos.shape[0], launch.device, common["device"]
    cutoff = common["cutoff"]
    cl, sentinel = nv.cell_list, nv.neighbor_utils.empty_sentinel
    cells, radius = ints(b), ints(b, 3)  # cells per graph (upper bound), cells searched around each
    with launch.stream():
        wp.launch(
            cl.get_build_cell_list_kernel(
                "estimate_sizes", scalar, batched=True, min_cells_per_dimension=MIN_CELLS_PER_DIMENSION
            ),
            dim=b,
            inputs=[
                common["cell"],
                sentinel(1, wp.bool, wp_device),
                common["pbc"],
                scalar(cutoff),
                nv.base_dispatch.DEFAULT_BATCH_MAX_NBINS,
                view(cells, wp.int32),
                sentinel(1, wp.int32, wp_device),
                view(radius, wp.vec3i),
            ],
            device=wp_device,
        )
    total_cells = int(cells.sum())
    per_system = ints(b)
    grid = {
        "cells_per_dimension": view(ints(b, 3), wp.vec3i),
        "cell_offsets": view(ints(b), wp.int32),
        "atom_periodic_shifts": view(ints(n, 3), wp.vec3i),
        "atom_to_cell_mapping": view(ints(n, 3), wp.vec3i),
        "atoms_per_cell_count": view(ints(total_cells), wp.int32),
        "cell_atom_start_indices": view(ints(total_cells), wp.int32),
        "cell_atom_list": view(ints(n), wp.int32),
    }
    with launch.stream():
        nv.batch_build_cell_list(
            **common,
            **grid,
            cells_per_system=view(per_system, wp.int32),
            min_cells_per_dimension=MIN_CELLS_PER_DIMENSION,
        )
    query: dict[str, Any] = {"strategy": "atom_centric"}
    if device.type == "cuda" and cl.select_batch_cell_list_strategy(n, b, float(cutoff)) == "pair_centric":
        built_cells = int(per_system.sum())
        r_max = tuple(int(r) for r in radius.max(dim=0).values.tolist())
        n_outer = cl.compute_batch_pair_centric_n_outer(r_max, False)
        if cl.is_pair_centric_parallelism_sufficient(n, built_cells, n_outer):
            query = {
                "strategy": "pair_centric",
                "cells_per_system": view(per_system, wp.int32),
                "total_cells": built_cells,
                "n_outer": n_outer,
                "R_max": r_max,
            }

    def cell_list_search(width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        matrix, num, shifts, out = launch.outputs(width)
        extra = {}
        if query["strategy"] == "pair_centric":
            extra = {
                "cell_to_system": view(ints(max(query["total_cells"], 1)), wp.int32),
                "sorted_positions": view(torch.empty_like(launch.pos), vec),
                "sorted_atom_periodic_shifts": view(torch.empty(n, 3, dtype=torch.int32, device=device), wp.vec3i),
            }
        with launch.stream():
            nv.batch_query_cell_list(
                **common, **grid, neighbor_search_radius=view(radius, wp.vec3i), **out, **query, **extra
            )
        return matrix, num, shifts

    return cell_list_search
