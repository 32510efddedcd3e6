"""The model's prepared batch, built in one place for the regular path and the CUDA-graph engines.

:func:`model_batch` assembles Contract 1's batch (``x``, ``pos``, ``batch``, ``edge_index`` and,
where given, ``edge_shift`` / ``cell`` / ``pbc``, ``graph_attr``, ``ptr``) from tensors. The regular
path (:func:`call_batch`: edges from hydra-data's neighbour list, ``ptr``, positional encodings)
and the static engines (:func:`.graphs.base.static_forward`: edges from static buffers, sink
padding) both go through it, so a field the model reads is set the same way on either path.
"""

from __future__ import annotations

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch

from hydragnn.data.neighbors import radius_graph

from .inputs import CallInputs
from .model_info import ModelInfo, ServedModel
from .neighbors import NeighborCache
from .positional import positional_encodings


def model_batch(
    model: ServedModel,
    *,
    pos: torch.Tensor,
    numbers: torch.Tensor,
    batch: torch.Tensor,
    edge_index: torch.Tensor,
    num_graphs: int,
    graph_attr: torch.Tensor | None = None,
    edge_shift: torch.Tensor | None = None,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | None = None,
    ptr: torch.Tensor | None = None,
) -> Batch:
    """The batch a :class:`~hydragnn.models.HydraModel` consumes.

    Args:
        model: the model (its ``dtype`` is the dtype of ``x`` and ``graph_attr``).
        pos: ``[N, 3]`` positions; numbers: ``[N]`` atomic numbers (``x = numbers [N, 1]``).
        batch: ``[N]`` structure of each atom; num_graphs: B.
        edge_index: ``[2, E]`` (source, target).
        graph_attr: ``[B, G]`` graph inputs, or ``None`` for a model without any.
        edge_shift, cell, pbc: ``[E, 3]`` Cartesian image offsets, ``[B, 3, 3]``, ``[B, 3]``; set
            together, when ``cell`` is given (a periodic batch).
        ptr: ``[B + 1]`` node offsets of each structure, where the caller has them.
    """
    b = Batch()
    b.x = numbers.to(model.dtype).unsqueeze(-1)
    b.pos = pos
    b.batch = batch
    if ptr is not None:
        b.ptr = ptr
    b._num_graphs = num_graphs
    b.edge_index = edge_index
    if cell is not None:
        b.edge_shift, b.cell, b.pbc = edge_shift, cell, pbc
    if graph_attr is not None:
        b.graph_attr = graph_attr.to(model.dtype)
    return b


def call_batch(model: ServedModel, info: ModelInfo, call: CallInputs, neighbors: NeighborCache | None = None) -> Batch:
    """The regular path's batch for a validated call.

    Edges come from :func:`hydragnn.data.neighbors.radius_graph` (the model's cutoff and
    neighbour cap; periodic images where ``call`` has a cell), through ``neighbors`` when given
    (the same edges, possibly filtered from a list kept with a Verlet skin; see
    :mod:`.neighbors`); a model with ``pe_dim > 0`` also gets ``lap_pe`` / ``rw_pe``
    ``[N, pe_dim]``, computed structure by structure.
    """
    if neighbors is not None:
        edge_index, edge_shift = neighbors.edges(call, info.cutoff, info.max_neighbours)
    else:
        edge_index, edge_shift = radius_graph(
            call.pos, info.cutoff, batch=call.batch, cell=call.cell, pbc=call.pbc, max_neighbours=info.max_neighbours
        )
    ptr = torch.zeros(call.num_graphs + 1, dtype=torch.long, device=call.pos.device)
    ptr[1:] = torch.cumsum(call.counts, 0)
    b = model_batch(
        model,
        pos=call.pos,
        numbers=call.numbers,
        batch=call.batch,
        edge_index=edge_index,
        num_graphs=call.num_graphs,
        graph_attr=call.graph_attr(info.graph_inputs, model.dtype),
        edge_shift=edge_shift,
        cell=call.cell,
        pbc=call.pbc,
        ptr=ptr,
    )
    pe_dim = model.config.attention.pe_dim
    if pe_dim:
        lap_pe, rw_pe = positional_encodings(edge_index, call.batch, call.counts, pe_dim)
        b.lap_pe, b.rw_pe = lap_pe, rw_pe  # pyright: ignore[reportAttributeAccessIssue]  # a PyG Batch is a Data at runtime (DynamicInheritance)
    return b
