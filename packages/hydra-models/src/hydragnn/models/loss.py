"""Per-output losses weighted by ``task_weights`` (shared with hydra-train).

Targets come from the prepared batch: ``graph_output [B, Og]``, ``node_output [N, On]``,
``edge_output [E, Oe]``, each output at its columns (:meth:`Schema.output_slices`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch.nn import functional as F
from torch_geometric.data import Data

from hydragnn.data import Schema

from .errors import ModelError

LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "mse": lambda p, t, delta: F.mse_loss(p, t),
    "mae": lambda p, t, delta: F.l1_loss(p, t),
    "huber": lambda p, t, delta: F.huber_loss(p, t, delta=delta),
    "smooth_l1": lambda p, t, delta: F.smooth_l1_loss(p, t, beta=delta),
}
"""``loss_function_type`` -> ``f(prediction, target, delta)`` (mean over elements)."""

ELEMENTWISE: dict[str, Callable[..., torch.Tensor]] = {
    "mse": lambda p, t, delta: (p - t).pow(2),
    "mae": lambda p, t, delta: (p - t).abs(),
    "huber": lambda p, t, delta: F.huber_loss(p, t, delta=delta, reduction="none"),
    "smooth_l1": lambda p, t, delta: F.smooth_l1_loss(p, t, beta=delta, reduction="none"),
}
"""The same losses per element, for weighted means."""

_TARGETS = {"graph": "graph_output", "node": "node_output", "edge": "edge_output"}


def atom_counts(batch: Data) -> torch.Tensor:
    """Atoms per graph ``[B]`` (int64): from ``ptr`` in a collated batch, else ``num_nodes``."""
    ptr = getattr(batch, "ptr", None)
    if ptr is not None:
        return ptr[1:] - ptr[:-1]
    device = cast(torch.Tensor, batch.pos).device if "pos" in batch else None
    return torch.tensor([batch.num_nodes], dtype=torch.long, device=device)


def _row_weights(graph_weights: torch.Tensor, batch: Data, level: str) -> torch.Tensor:
    """Per-row weights of an output of ``level`` from per-graph weights ``[B]``."""
    if level == "graph":
        return graph_weights
    node_graph = getattr(batch, "batch", None)
    if node_graph is None:
        num_nodes = cast(int, batch.num_nodes)  # a prepared graph: known from x or pos
        node_graph = torch.zeros(num_nodes, dtype=torch.long, device=graph_weights.device)
    if level == "node":
        return graph_weights[node_graph]
    edge_index = cast(torch.Tensor, batch.edge_index)  # an edge output: the batch has its edges
    return graph_weights[node_graph[edge_index[1]]]


def targets(batch: Data, schema: Schema) -> dict[str, torch.Tensor]:
    """``{output name: target [rows, dim]}`` sliced from the batch's derived target tensors.

    Raises:
        ModelError: when the batch lacks the target tensor of an output's level.
    """
    slices = schema.output_slices()
    out: dict[str, torch.Tensor] = {}
    for var in schema.outputs:
        key = _TARGETS[var.level]
        tensor = getattr(batch, key, None)
        if tensor is None:
            raise ModelError(f"output {var.name!r} ({var.level}): the batch has no {key!r} targets (was it prepared?)")
        out[var.name] = tensor[:, slices[var.name]]
    return out


def compute_loss(
    outputs: Mapping[str, torch.Tensor],
    batch: Data,
    schema: Schema,
    *,
    task_weights: Mapping[str, float] | Sequence[float] | None = None,
    loss_type: str = "mse",
    huber_delta: float = 1.0,
    per_atom: Collection[str] = (),
    graph_weights: torch.Tensor | None = None,
    scales: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted sum of per-output losses.

    Args:
        outputs: predictions ``{name: [rows, dim]}`` (as returned by ``HydraModel``).
        batch: the prepared batch holding the targets.
        schema: the schema naming the outputs.
        task_weights: ``{name: weight}`` or one weight per output in schema order (default 1).
        loss_type: ``mse``, ``mae``, ``huber`` or ``smooth_l1``.
        huber_delta: ``delta`` of the Huber loss and ``beta`` of smooth L1.
        per_atom: graph outputs compared divided by each graph's atom count (an energy in
            eV/atom, so that large and small structures weigh alike).
        graph_weights: ``[B]`` weight of each structure (its data source's): every output's
            loss is then the weighted mean over its rows (a node or edge row takes its graph's
            weight), ``sum(w * l) / sum(w)``.
        scales: ``{name: [dim]}``: those outputs are compared divided by their scale per column
            (``Architecture.output_scaling``: the loss in normalised units).

    Returns:
        ``(total, {name: loss})``: scalar tensors in at least float32; the per-output values
        are unweighted and keep their graph (call ``.detach()`` for logging). Outputs with
        weight 0 are still reported.

    Raises:
        ModelError: unknown loss type, missing prediction or target, or mismatched shapes.
    """
    if loss_type not in LOSSES:
        raise ModelError(f"loss_function_type: expected one of {sorted(LOSSES)}, found {loss_type!r}")
    names = [v.name for v in schema.outputs]
    if task_weights is None:
        weights = {n: 1.0 for n in names}
    elif isinstance(task_weights, Mapping):
        weights = {n: float(task_weights.get(n, 1.0)) for n in names}
    else:
        if len(task_weights) != len(names):
            raise ModelError(
                f"task_weights: expected {len(names)} weights (one per output: {names}), found {len(task_weights)}"
            )
        weights = {n: float(w) for n, w in zip(names, task_weights)}
    fn = LOSSES[loss_type]
    wanted = targets(batch, schema)
    atoms = atom_counts(batch) if per_atom else None
    per_head: dict[str, torch.Tensor] = {}
    total: torch.Tensor | None = None
    for name in names:
        if name not in outputs:
            raise ModelError(f"output {name!r}: no prediction (predictions have {sorted(outputs)})")
        pred, target = outputs[name], wanted[name]
        if pred.shape != target.shape:
            raise ModelError(
                f"output {name!r}: prediction shape {tuple(pred.shape)} != target shape {tuple(target.shape)}"
            )
        dtype = torch.promote_types(torch.promote_types(pred.dtype, target.dtype), torch.float32)
        pred, target = pred.to(dtype), target.to(dtype)
        if atoms is not None and name in per_atom:  # (atoms: counted when per_atom names any)
            scale = atoms.to(device=pred.device, dtype=dtype).reshape(-1, 1)
            pred, target = pred / scale, target / scale
        if scales is not None and name in scales:
            column = scales[name].to(device=pred.device, dtype=dtype)
            pred, target = pred / column, target / column
        if graph_weights is None:
            value = fn(pred, target, huber_delta)
        else:
            rows = _row_weights(graph_weights, batch, schema[name].level).to(device=pred.device, dtype=dtype)
            elem = ELEMENTWISE[loss_type](pred, target, huber_delta)
            value = (elem * rows.unsqueeze(-1)).sum() / (rows.sum().clamp(min=1e-12) * elem.shape[-1])
        per_head[name] = value
        term = value if weights[name] == 1.0 else weights[name] * value
        total = term if total is None else total + term
    assert total is not None  # a schema has at least one output
    return total, per_head
