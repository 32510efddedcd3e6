"""Evaluate a saved model on a dataset container or on a file ASE reads (``hydragnn-predict``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from hydragnn.data import create_dataloaders
from hydragnn.models import load_artifact
from hydragnn.models.metrics import training_label_keys

from .data import evaluation_samples
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
    """
    model = load_artifact(artifact)
    if head is not None:
        model.select_head(head)
    options: dict[str, Any] = training_label_keys(model)  # the served head's source, with several
    options.update(labels or {})
    samples = evaluation_samples(dataset, model.schema, model.cutoff, model.config.attention.pe_dim, options)
    _, _, loader = create_dataloaders(None, None, samples, batch_size)
    loss, heads, trues, preds, extras = evaluate_losses(_as_strategy(model), loader, collect=True)
    report = mae_report(trues, preds, extras.get("natoms"), head_units(model))
    return {"loss": loss, "heads": heads, "mae": report}, trues, preds
