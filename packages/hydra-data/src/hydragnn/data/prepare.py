"""``prepare(sample, schema)``: turn a raw sample into the prepared-graph contract.

Every source attribute of width ``dim`` must have the shape the seed's contract names (N nodes,
E edges): node variables ``(N, dim)``, edge variables ``(E, dim)``, graph variables
``(1, dim)``; PyG then batches graph variables into ``(B, dim)`` with no special rule. A flat
``(N,)``, ``(dim,)`` or scalar is refused with a message giving the shape to use (for example
``atomic_number.reshape(-1, 1)`` or ``energy.reshape(1, 1)``).

Source attributes themselves are left untouched on the prepared sample. Feature tensors
(``x``, ``edge_attr``, ``graph_attr``) and targets (``node_output``, ``edge_output``,
``graph_output``, ``y``) are floating point: integer sources (atomic numbers, say) are cast to
the default dtype, floating sources keep their promoted dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from .errors import SchemaError
from .pyg_data import new_data
from .schema import LEVELS, RESERVED_NAMES, Schema, Variable
from .validation import check_sample

_DERIVED_BY_LEVEL = {
    "node": ("x", "node_output"),
    "edge": ("edge_attr", "edge_output"),
    "graph": ("graph_attr", "graph_output"),
}


def _where(index: int | None) -> str:
    return f"sample {index}" if index is not None else "sample"


def _describe(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"shape {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
    return f"a {type(t).__name__}"


def _float_dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _counts(sample: Data, schema: Schema, where: str) -> dict[str, Any]:
    """Number of rows expected at each level (N is taken from ``pos``, else the first node input)."""
    counts: dict[str, Any] = {"graph": 1}
    node_src = schema.position or schema.feature_inputs("node")[0]
    t = getattr(sample, node_src.name, None)
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        raise SchemaError(
            f"{where}: variable {node_src.name!r} (node, dim {node_src.dim}): expected a tensor of shape "
            f"(N, {node_src.dim}), found {'nothing' if t is None else _describe(t)}"
        )
    counts["node"] = int(t.shape[0])
    counts["node_source"] = node_src.name
    edge_index = getattr(sample, "edge_index", None)
    if edge_index is not None:
        if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise SchemaError(f"{where}: 'edge_index': expected shape (2, E) int64, found {_describe(edge_index)}")
        if edge_index.dtype != torch.long:
            raise SchemaError(f"{where}: 'edge_index': expected dtype int64, found {_describe(edge_index)}")
        counts["edge"] = int(edge_index.shape[1])
    return counts


def _checked(sample: Data, var: Variable, counts: dict[str, Any], where: str) -> torch.Tensor:
    """The source tensor of ``var`` validated to be ``(rows, dim)``; flat shapes are refused."""
    label = f"{where}: variable {var.name!r} ({var.level}, dim {var.dim})"
    if var.level == "edge" and "edge" not in counts:
        raise SchemaError(f"{label}: edge-level variables need 'edge_index' (2, E) on the sample; none found")
    rows = counts[var.level]
    rows_text = {"node": f"N={rows}", "edge": f"E={rows}", "graph": "1"}[var.level]
    if var.level == "node" and var.name != counts["node_source"]:
        rows_text += f" from {counts['node_source']!r}"
    kind = "a floating dtype" if var.is_position else "a real dtype (floating or integer)"
    expected = f"shape ({rows_text}, {var.dim}) with {kind}"
    t = getattr(sample, var.name, None)
    if t is None:
        raise SchemaError(f"{label}: attribute missing; expected a tensor of {expected}")
    if not isinstance(t, torch.Tensor):
        raise SchemaError(f"{label}: expected a torch.Tensor of {expected}, found {_describe(t)}")
    if t.dtype == torch.bool or t.is_complex():
        raise SchemaError(f"{label}: wrong dtype: expected {expected}, found {_describe(t)}")
    if var.is_position and not t.is_floating_point():
        raise SchemaError(f"{label}: positions must be floating point: expected {expected}, found {_describe(t)}")
    shape = tuple(t.shape)
    if shape == (rows, var.dim):
        return t
    hint = ""
    if t.numel() == rows * var.dim and t.dim() < 2:
        lead = {"node": ("N", -1), "edge": ("E", -1), "graph": ("1", 1)}[var.level]
        hint = f"; {var.level} variables have shape ({lead[0]}, dim): use {var.name}.reshape({lead[1]}, {var.dim})"
    raise SchemaError(f"{label}: wrong shape: expected {expected}, found {_describe(t)}{hint}")


def _check_geometry(data: Data, counts: dict[str, Any], where: str) -> None:
    """Normalise ``cell``/``pbc`` to ``(1, 3, 3)``/``(1, 3)`` and check ``edge_shift``."""
    cell = getattr(data, "cell", None)
    if cell is not None:
        if (
            not isinstance(cell, torch.Tensor)
            or tuple(cell.shape) not in ((3, 3), (1, 3, 3))
            or not cell.is_floating_point()
        ):
            raise SchemaError(
                f"{where}: 'cell': expected a floating tensor of shape (3, 3) or (1, 3, 3), found {_describe(cell)}"
            )
        data.cell = cell.reshape(1, 3, 3)
    pbc = getattr(data, "pbc", None)
    if pbc is not None:
        if not isinstance(pbc, torch.Tensor) or tuple(pbc.shape) not in ((3,), (1, 3)):
            raise SchemaError(f"{where}: 'pbc': expected a tensor of shape (3,) or (1, 3), found {_describe(pbc)}")
        data.pbc = pbc.reshape(1, 3).to(torch.bool)
    shift = getattr(data, "edge_shift", None)
    if shift is not None:
        rows = counts.get("edge")
        if not isinstance(shift, torch.Tensor) or rows is None or tuple(shift.shape) != (rows, 3):
            raise SchemaError(
                f"{where}: 'edge_shift': expected shape (E={rows}, 3) next to edge_index, found {_describe(shift)}"
            )


def prepare(sample: Data, schema: Schema, index: int | None = None) -> Data:
    """Build the prepared graph of ``sample`` according to ``schema``.

    Args:
        sample: a PyG ``Data`` carrying every source attribute the schema names.
        schema: the validated ``Variables`` schema.
        index: position of the sample in its dataset, used in error messages.

    Returns:
        A new ``Data`` with every attribute of ``sample`` except stale derived tensors, plus
        ``x [N, Fx]``, ``edge_attr [E, Fe]`` (edge inputs), ``graph_attr [1, Fg]`` (graph
        inputs), ``node_output [N, On]`` / ``edge_output [E, Oe]`` / ``graph_output [1, Og]``
        (outputs present at that level), ``y [sum of output sizes, 1]`` (all outputs flattened
        in JSON order) and ``y_loc [1, n_outputs + 1]`` (int64 boundaries of each output in
        ``y``). A schema without outputs gives no ``y`` / ``y_loc`` / ``*_output`` (stale ones
        are removed): a sample for prediction. ``pos`` is the same tensor object as the source
        (autograd is preserved).

    Raises:
        SchemaError: naming the sample index, the variable, expected and found shape/dtype.
        StructureError: atomic numbers outside 1..118 or not integers, non-finite positions or cell
            (:func:`hydragnn.data.validation.check_sample`).
    """
    where = _where(index)
    if not isinstance(sample, Data):
        raise SchemaError(f"{where}: expected a torch_geometric Data, found {type(sample).__name__}")
    counts = _counts(sample, schema, where)
    checked = {var.name: _checked(sample, var, counts, where) for var in (*schema.inputs, *schema.outputs)}

    data = new_data()
    for key, value in cast(Iterable[tuple[str, Any]], sample):  # (key, value) pairs; PyG types __iter__ loosely
        if key not in RESERVED_NAMES:
            data[key] = value
    _check_geometry(data, counts, where)
    check_sample(data, schema, where)

    for key, value in derived_tensors(checked, schema).items():
        data[key] = value
    return data


def derived_tensors(
    checked: Mapping[str, torch.Tensor], schema: Schema, rows: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The tensors :func:`prepare` derives, in the order it sets them: per level the features
    (``x``, ``edge_attr``, ``graph_attr``) and outputs (``node_output`` ...), then ``y`` and ``y_loc``.

    Args:
        checked: every schema variable's ``(rows, dim)`` source tensor, by name.
        schema: the schema.
        rows: ``None`` for one sample; for samples laid end to end (each variable's rows
            concatenated), ``{level: [B] int64 rows of each sample}`` for the levels of the
            schema's outputs. Row-wise concatenations then need nothing per sample, and ``y`` /
            ``y_loc`` come out laid end to end too: ``y [sum of sizes, 1]`` (each sample's outputs
            flattened in JSON order, sample after sample) and ``y_loc [B, n_outputs + 1]``.
    """
    out: dict[str, torch.Tensor] = {}
    for level in LEVELS:
        feature_key, output_key = _DERIVED_BY_LEVEL[level]
        feats = [checked[v.name] for v in schema.feature_inputs(level)]
        if feats:
            dtype = _float_dtype(feats)
            out[feature_key] = torch.cat([t.to(dtype) for t in feats], dim=1)
        outs = [checked[v.name] for v in schema.outputs_at(level)]
        if outs:
            dtype = _float_dtype(outs)
            out[output_key] = torch.cat([t.to(dtype) for t in outs], dim=1)
    targets = [checked[v.name] for v in schema.outputs]
    if not targets:
        return out
    y_dtype = _float_dtype(targets)
    if rows is None:
        flat = [t.reshape(-1).to(y_dtype) for t in targets]
        out["y"] = torch.cat(flat).reshape(-1, 1)
        sizes = torch.tensor([0] + [f.numel() for f in flat], dtype=torch.long)
        out["y_loc"] = torch.cumsum(sizes, dim=0).reshape(1, -1)
        return out
    # sample b's block of output v has rows[v.level][b] * v.dim values; y lays each sample's blocks in order
    sizes = torch.stack([rows[v.level] * v.dim for v in schema.outputs], dim=1)  # [B, V]
    y_loc = torch.cumsum(torch.cat([torch.zeros_like(sizes[:, :1]), sizes], dim=1), dim=1)
    totals = y_loc[:, -1]
    sample_start = torch.cumsum(totals, 0) - totals
    y = torch.empty(int(totals.sum()), dtype=y_dtype)
    samples = torch.arange(sizes.shape[0])
    for v, t in enumerate(targets):
        owner = torch.repeat_interleave(samples, sizes[:, v])
        block_start = torch.cumsum(sizes[:, v], 0) - sizes[:, v]
        place = (sample_start + y_loc[:, v] - block_start)[owner] + torch.arange(owner.numel())
        y[place] = t.reshape(-1).to(y_dtype)
    out["y"] = y.reshape(-1, 1)
    out["y_loc"] = y_loc
    return out


def prepare_all(samples, schema: Schema) -> list[Data]:
    """``[prepare(s, schema, index=i) for i, s in enumerate(samples)]``."""
    return [prepare(s, schema, index=i) for i, s in enumerate(samples)]
