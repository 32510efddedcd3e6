"""A chunk of converted frames built column by column: one ``PackedChunk`` instead of a ``Data``
per frame (for :func:`~hydragnn.data.io.conversion_samples.write_samples`).

The frames' arrays (:func:`~hydragnn.data.io.ase_labels.frame_arrays`) are concatenated once per
attribute; the derived tensors come from :func:`~hydragnn.data.prepare.derived_tensors` on the
concatenation, the edges from one search (:func:`~hydragnn.data.neighbors.search.radius_edges`),
and every field is laid out as the ``.pt`` chunk stores it. The samples are those the per-frame
path gives (``prepare`` then ``add_edges``): the same attributes in the same order, bit for bit;
what it saves is ~30 small tensor operations and three ``Data`` objects per frame, most of a
small structure's conversion. A chunk it cannot take (frames with different attributes, a schema
with other inputs or edge variables, a frame a check refuses) returns ``None``: the per-frame path
then converts it and names the frame at fault.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..containers.codec import build_data
from ..containers.packed_chunk import PackedChunk, Rows
from ..errors import DataError
from ..neighbors.brute_force import Edges, cartesian_shift
from ..neighbors.search import radius_edges
from ..prepare import derived_tensors
from ..schema import RESERVED_NAMES, Schema
from ..validation import check_sample
from .ase_labels import SCHEMA_INPUTS

__all__ = ["pack_frames", "packable"]

_NODE_KEYS = {"atomic_number", "pos", "x", "node_output"}


def packable(schema: Schema) -> bool:
    """Whether frames of ``schema`` can be packed: the conversion's own inputs (atomic numbers,
    positions) and node or graph outputs."""
    return tuple(schema.inputs) == SCHEMA_INPUTS and all(v.level in ("node", "graph") for v in schema.outputs)


def pack_frames(
    arrays: Sequence[dict[str, np.ndarray]], schema: Schema, cutoff: float
) -> tuple[PackedChunk, torch.Tensor] | None:
    """The prepared samples of ``arrays`` (one dict per frame, all with the same keys) with their
    edges at ``cutoff``, as one chunk, and the ``[B]`` length of each sample's shortest edge
    (``inf`` without edges); ``None`` when the chunk must go frame by frame (module docstring)."""
    keys = list(arrays[0])
    if not packable(schema) or RESERVED_NAMES & set(keys) or any(list(a) != keys for a in arrays[1:]):
        return None
    cols = {key: torch.from_numpy(np.concatenate([a[key] for a in arrays])) for key in keys}
    count = len(arrays)
    atoms = cols["natoms"]
    node_level = _NODE_KEYS | {v.name for v in schema.outputs if v.level == "node"}
    try:
        check_sample(build_data({"atomic_number": cols["atomic_number"], "pos": cols["pos"]}), schema, "chunk")
        cell = cols.get("cell")
        batch = torch.repeat_interleave(torch.arange(count), atoms)
        edges = radius_edges(cols["pos"], cutoff, batch, cell, None if cell is None else cols["pbc"], None, False)
    except DataError:
        return None
    ones = torch.ones(count, dtype=torch.long)
    derived = derived_tensors(
        {v.name: cols[v.name] for v in (*schema.inputs, *schema.outputs)}, schema, {"node": atoms, "graph": ones}
    )
    fields: dict[str, tuple[torch.Tensor | Rows, torch.Tensor]] = {}
    for key, t in {**cols, **derived}.items():
        rows = atoms if key in node_level else ones
        if key == "y":
            rows = derived["y_loc"][:, -1]
        fields[key] = (t.reshape(-1), _shapes(rows, t.shape[1:]))
    owner = batch[edges.edge_index[1]]  # edges are sorted by target: each sample's edges are one range
    per_sample = torch.bincount(owner, minlength=count)
    first_edge = torch.cumsum(per_sample, 0) - per_sample
    local = edges.edge_index - (torch.cumsum(atoms, 0) - atoms)[owner]
    at = first_edge[owner] + torch.arange(owner.numel())  # sample b's [2, E_b] block starts at 2 * first_edge[b]
    flat = torch.empty(2 * owner.numel(), dtype=torch.long)
    flat[at] = local[0]
    flat[at + per_sample[owner]] = local[1]
    fields["edge_index"] = (flat, torch.stack([torch.full((count,), 2), per_sample], dim=1))
    if cell is not None:
        fields["edge_shift"] = (_offset_rows(edges, owner, cell), _shapes(per_sample, (3,)))
    shortest = torch.full((count,), torch.inf, dtype=edges.length2.dtype)
    shortest = shortest.scatter_reduce(0, owner, edges.length2, "amin").sqrt()
    return PackedChunk(count, fields), shortest


def _offset_rows(edges: Edges, owner: torch.Tensor, cell: torch.Tensor) -> Rows | torch.Tensor:
    """The edges' Cartesian offsets as rows of a table of every sample's image offsets
    (:func:`~hydragnn.data.neighbors.brute_force.cartesian_shift` of each image, so bit for bit the
    edges' own) indexed per edge; the plain ``[E * 3]`` values when the table would not be smaller."""
    shift = edges.shift_int
    plain = edges.edge_shift.reshape(-1)
    if not shift.numel():
        return plain
    low, high = (int(v) for v in torch.aminmax(shift))
    reach = max(-low, high)
    side = 2 * reach + 1
    images = side**3
    if cell.shape[0] * images >= shift.shape[0]:
        return plain
    axis = torch.arange(-reach, reach + 1)
    grid = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    table = cartesian_shift(grid.repeat(cell.shape[0], 1), cell.repeat_interleave(images, 0))
    local = ((shift[:, 0] + reach) * side + shift[:, 1] + reach) * side + shift[:, 2] + reach
    rows = Rows(table, owner * images + local)
    return rows if torch.equal(rows.values(), plain) else plain


def _shapes(rows: torch.Tensor, rest: Sequence[int]) -> torch.Tensor:
    """``[B, 1 + len(rest)]`` int64 shapes ``(rows[b], *rest)``."""
    tail = torch.tensor(list(rest), dtype=torch.long).expand(rows.shape[0], len(rest))
    return torch.cat([rows.to(torch.long).unsqueeze(1), tail], dim=1)
