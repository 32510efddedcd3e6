"""Evaluate a saved model on a dataset container or on a file ASE reads (``hydragnn-predict``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from hydragnn.data import create_dataloaders
from hydragnn.models import load_artifact, read_manifest
from hydragnn.models.metrics import training_label_keys

from .data import evaluation_samples
from .errors import TrainError
from .evaluate import _as_strategy, evaluate_losses, head_units, mae_report

__all__ = ["predict"]


def predict(
    artifact: str | os.PathLike,
    dataset: str | os.PathLike,
    *,
    batch_size: int = 16,
    labels: Mapping[str, Any] | None = None,
    head: str | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Evaluate a saved model on a dataset container or on a file ASE reads.

    A file's labels are read under the keys of the model's training config (stored in the
    artifact) unless ``labels`` (:class:`~hydragnn.data.AseSource` keyword arguments such as
    ``energy_key``) says otherwise. ``head`` names the energy head of a model with several (one
    per training source; default: the first).

    Returns:
        ``({"loss", "heads", "mae"}, targets, predictions)``; ``mae`` holds each head's
        ``mae``, ``rmse``, ``unit`` and ``count``.

    Raises:
        TrainError: a structure holds species the model was not trained on (the artifact's
            ``species``), as the calculator refuses them: its numbers would mean nothing.
    """
    model = load_artifact(artifact)
    if head is not None:
        model.select_head(head)
    options: dict[str, Any] = training_label_keys(model)  # the served head's source, with several
    options.update(labels or {})
    samples = evaluation_samples(dataset, model.schema, model.cutoff, model.config.attention.pe_dim, options)
    _check_species(samples, read_manifest(artifact).get("species"), dataset)
    _, _, loader = create_dataloaders(None, None, samples, batch_size)
    loss, heads, trues, preds, extras = evaluate_losses(_as_strategy(model), loader, collect=True)
    report = mae_report(trues, preds, extras.get("natoms"), head_units(model))
    return {"loss": loss, "heads": heads, "mae": report}, trues, preds


def _check_species(samples: Any, species: Any, dataset: str | os.PathLike) -> None:
    """Refuse samples with atomic numbers outside ``species`` (``None``: the artifact lists none)."""
    if not species:
        return
    known = {int(z) for z in species}
    for index, sample in enumerate(samples):
        numbers = getattr(sample, "atomic_number", None)
        if numbers is None:
            continue
        unknown = sorted({int(z) for z in torch.unique(numbers).tolist()} - known)
        if unknown:
            raise TrainError(
                f"{dataset}: structure {index} holds species {unknown} that the model was not trained on (its "
                f"species: {sorted(known)}); its predictions for them would mean nothing"
            )
