"""Padding a batch with a sink graph (fixed shapes for CUDA-graph replay).

The sink graph holds the extra nodes (at the origin, zero features); the extra edges point
sink -> sink with zero length. A capture-safe model gives the real nodes, edges and graphs of
the padded batch exactly the outputs of the unpadded batch; the sink's outputs are dropped.
"""

from __future__ import annotations

from typing import cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Batch, Data

from .errors import ModelError

NODE_KEYS = ("x", "pos", "node_output", "lap_pe", "rw_pe")
EDGE_KEYS = ("edge_attr", "edge_shift", "edge_output")
GRAPH_KEYS = ("graph_attr", "graph_output", "head")
"""Contract tensors padded with zero rows; every other attribute is dropped."""


def _counts(batch: Data) -> tuple[int, int, int]:
    n = int(cast(torch.Tensor, batch.x).shape[0])  # (a prepared batch: x is always there)
    edge_index = getattr(batch, "edge_index", None)
    e = int(edge_index.shape[1]) if edge_index is not None else 0
    b = int(batch.num_graphs) if isinstance(batch, Batch) else 1
    return n, e, b


def pad_with_sink(
    batch: Data,
    extra_nodes: int = 1,
    extra_edges: int = 0,
    *,
    num_nodes: int | None = None,
    num_edges: int | None = None,
) -> Batch:
    """Append a sink graph of ``extra_nodes`` nodes and ``extra_edges`` sink -> sink edges.

    Args:
        batch: a prepared ``Batch`` (or one ``Data``) with B graphs, N nodes, E edges.
        extra_nodes: nodes of the sink graph (>= 1), unless ``num_nodes`` is given.
        extra_edges: zero-length edges on the first sink node (>= 0), unless ``num_edges`` is given.
        num_nodes: pad to exactly this many nodes (> N).
        num_edges: pad to exactly this many edges (>= E).

    Returns:
        A new ``Batch`` with B + 1 graphs: ``x``, ``pos``, ``batch``, ``ptr``, ``edge_index``,
        ``edge_shift``, ``edge_attr``, ``cell`` (identity for the sink), ``pbc`` (False),
        ``graph_attr``, the energy ``head`` of each structure and the targets ``node_output`` /
        ``edge_output`` / ``graph_output``,
        padded with zeros. Other attributes (``y``, ``y_loc``, raw sources) are not carried.

    Raises:
        ModelError: when the requested sizes are smaller than the batch.
    """
    n, e, b = _counts(batch)
    add_n = extra_nodes if num_nodes is None else num_nodes - n
    add_e = extra_edges if num_edges is None else num_edges - e
    if add_n < 1 or add_e < 0:
        raise ModelError(
            f"pad_with_sink: needs at least one sink node and no negative edge count; batch has N={n}, E={e}, "
            f"asked for {add_n} extra nodes and {add_e} extra edges"
        )
    device = cast(torch.Tensor, batch.x).device
    out = Batch()
    for key in NODE_KEYS + EDGE_KEYS + GRAPH_KEYS:
        t = getattr(batch, key, None)
        if t is None:
            continue
        rows = add_n if key in NODE_KEYS else add_e if key in EDGE_KEYS else 1
        out[key] = torch.cat([t, t.new_zeros((rows, *t.shape[1:]))])
    node_batch = getattr(batch, "batch", None)
    if node_batch is None:
        node_batch = torch.zeros(n, dtype=torch.long, device=device)
    out.batch = torch.cat([node_batch, torch.full((add_n,), b, dtype=torch.long, device=device)])
    ptr = getattr(batch, "ptr", None)
    if ptr is None:
        ptr = torch.tensor([0, n], dtype=torch.long, device=device)
    out.ptr = torch.cat([ptr, ptr.new_tensor([n + add_n])])
    edge_index = getattr(batch, "edge_index", None)
    if edge_index is None:
        edge_index = torch.zeros(2, 0, dtype=torch.long, device=device)
    out.edge_index = torch.cat([edge_index, torch.full((2, add_e), n, dtype=torch.long, device=device)], dim=1)
    cell = getattr(batch, "cell", None)
    if cell is not None:
        out.cell = torch.cat([cell, torch.eye(3, dtype=cell.dtype, device=cell.device).unsqueeze(0)])
    pbc = getattr(batch, "pbc", None)
    if pbc is not None:
        out.pbc = torch.cat([pbc, pbc.new_zeros((1, *pbc.shape[1:]))])
    out._num_graphs = b + 1
    return out
