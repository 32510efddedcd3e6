"""Evaluation: per-head losses over a loader (averaged across ranks) and the seed ``test``.

Forces of an interatomic potential need autograd even in evaluation: ``HydraModel.forward``
enables it internally for ``pos`` under ``torch.no_grad()`` and returns detached outputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hydragnn.models.loss import atom_counts
from hydragnn.models.loss import targets as batch_targets
from hydragnn.models.metrics import error_report, head_units  # noqa: F401  (head_units: loop, pipeline, tests)

from .progress import Progress
from .strategies.base import Strategy

__all__ = ["evaluate_losses", "head_units", "mae_report", "test"]


def _num_graphs(batch: Any) -> int:
    return int(getattr(batch, "num_graphs", 1))


def evaluate_losses(
    strategy: Strategy,
    loader: Any,
    *,
    collect: bool = False,
    reduce: bool = True,
) -> tuple[float, dict[str, float], dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Loss (total and per head) over ``loader``, weighted by graphs per batch, mean over ranks
    (this rank's alone when ``reduce`` is False), and the errors per head in physical units.

    Returns:
        ``(total, {head: loss}, targets, predictions, extras)``; targets / predictions are this
        rank's concatenated ``{head: [rows, dim]}`` when ``collect`` (else empty); extras hold
        ``errors`` (``{head: {"mae", "rmse", "unit", "count"}}`` over every component, energies
        per atom, see :func:`head_units`) and, when collected, ``natoms`` ``[B]`` per graph.
    """
    strategy.consolidate()  # local SGD: evaluate the averaged model, the same on every rank
    model = strategy.unwrap()
    names = [v.name for v in model.schema.outputs]
    units = head_units(model)
    was_training = model.training
    model.eval()
    # sums and errors stay on the model's device and are read once, after the loop
    sums = torch.zeros(len(names) + 2, dtype=torch.float64, device=strategy.device)
    errors = torch.zeros(len(names), 3, dtype=torch.float64, device=strategy.device)  # sum |d|, sum d^2, components
    preds: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    trues: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    natoms: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            for batch in loader:
                batch = strategy.to_device(batch)
                out = strategy.forward(batch)
                total, heads = model.loss(out, batch)
                n = _num_graphs(batch)
                sums[:-1].add_(torch.stack([total, *(heads[name] for name in names)]).double(), alpha=n)
                sums[-1] += n
                wanted = batch_targets(batch, model.schema)
                atoms = atom_counts(batch)
                for i, name in enumerate(names):
                    diff = out[name].detach().double() - wanted[name].detach().double()
                    if units[name][1] and diff.shape[0] == atoms.shape[0]:
                        diff = diff / atoms.double().reshape(-1, *([1] * (diff.dim() - 1)))
                    errors[i, :2] += torch.stack([diff.abs().sum(), diff.pow(2).sum()])
                    errors[i, 2] += diff.numel()
                if collect:
                    for name in names:
                        preds[name].append(out[name].detach().float().cpu())
                        trues[name].append(wanted[name].detach().float().cpu())
                    natoms.append(atoms.cpu())
    finally:
        model.train(was_training)
    if reduce:
        sums = strategy.all_reduce_sum(sums)
        errors = strategy.all_reduce_sum(errors)
    sums, errors = sums.cpu(), errors.cpu()
    count = max(float(sums[-1]), 1.0)
    total = float(sums[0]) / count
    per_head = {name: float(sums[1 + i]) / count for i, name in enumerate(names)}
    extras: dict[str, Any] = {"errors": {}}
    for i, name in enumerate(names):
        k = float(errors[i, 2])
        extras["errors"][name] = {
            "mae": float(errors[i, 0]) / k if k else float("nan"),
            "rmse": math.sqrt(float(errors[i, 1]) / k) if k else float("nan"),
            "unit": units[name][0],
            "count": int(k),
        }
    cat = {n: torch.cat(v) if v else torch.empty(0) for n, v in trues.items()} if collect else {}
    pcat = {n: torch.cat(v) if v else torch.empty(0) for n, v in preds.items()} if collect else {}
    if collect:
        extras["natoms"] = torch.cat(natoms) if natoms else torch.empty(0)
    return total, per_head, cat, pcat, extras


def _as_strategy(model: nn.Module | Strategy) -> Strategy:
    if isinstance(model, Strategy):
        return model
    strategy = Strategy()
    strategy._module = model
    strategy.model = model
    try:
        strategy.device = next(model.parameters()).device
    except StopIteration:
        pass
    return strategy


def test(
    loader: Any,
    model: nn.Module | Strategy,
    verbosity: int = 0,
    reduce_ranks: bool = True,
    return_samples: bool = True,
) -> tuple[float, dict[str, float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Evaluate ``model`` on ``loader`` (the seed API).

    Args:
        loader: a loader of prepared batches.
        model: a :class:`~hydragnn.models.HydraModel` (or a set-up strategy).
        verbosity: 3 and above prints the errors.
        reduce_ranks: under torch.distributed, average the losses over ranks (every rank must
            call); False: this rank's losses.
        return_samples: False returns empty target / prediction dicts (less memory).

    Returns:
        ``(error, task_errors, targets, predictions)``: the weighted total loss, ``{head: loss}``
        (the model's ``loss_function_type``), and this rank's ``{head: [rows, dim]}`` targets and
        predictions (float32, CPU).
    """
    strategy = _as_strategy(model)
    total, per_head, trues, preds, _ = evaluate_losses(
        strategy, loader, collect=bool(return_samples), reduce=bool(reduce_ranks)
    )
    heads = " ".join(f"{k}={v:.6g}" for k, v in per_head.items())
    Progress(verbosity, strategy.is_main).log(3, f"test loss {total:.6g} {heads}")
    return total, per_head, trues, preds


setattr(test, "__test__", False)  # noqa: B010  (not a pytest test when imported into a test module)


def gather_rows(strategy: Strategy, *parts: Any) -> tuple[Any, ...]:
    """Every rank's rows concatenated along dim 0 (a collective; rank order, then batch order).

    Each part is a ``{head: tensor}`` dict, a tensor or ``None``. With one process the parts come
    back unchanged. Validation/test samplers give each rank a disjoint share, so the result
    covers the whole set once.
    """
    if not (strategy.distributed and strategy.world_size > 1):
        return parts
    gathered: list[Any] = [None] * strategy.world_size
    dist.all_gather_object(gathered, parts)
    out: list[Any] = []
    for i, part in enumerate(parts):
        items = [g[i] for g in gathered]
        if part is None:
            out.append(None)
        elif isinstance(part, Mapping):
            out.append({k: torch.cat([item[k] for item in items]) for k in part})
        else:
            out.append(torch.cat(items))
    return tuple(out)


def mae_report(
    trues: Mapping[str, torch.Tensor],
    preds: Mapping[str, torch.Tensor],
    natoms: torch.Tensor | None,
    units: Mapping[str, tuple[str, bool]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per-head mean absolute and root-mean-square errors in physical units.

    ``units`` (default: :data:`UNITS` by name; :func:`head_units` for a model) gives each head's
    unit and whether it is reported per atom: an energy total is then compared as
    ``(pred - true) / natoms``. All components of a vector head count together. Computed by
    :func:`hydragnn.models.metrics.error_report`, which ``hydragnn-evaluate`` (hydra-infer) uses too.

    Returns:
        ``{head: {"mae", "rmse", "unit", "count"}}`` (``count``: rows, graphs or atoms).
    """
    return error_report(trues, preds, natoms, units)
