"""``Training.normalize_outputs``: each head's shift and scale from the training split.

Fills ``Architecture.output_scaling`` (:class:`hydragnn.models.ModelConfig`) before the model is
built, unless the config gives it: every output but an interatomic potential's energy, forces
and stress (which have ``energy_shift`` / ``energy_scale``) gets per column ``"minmax"`` (shift the
minimum, scale the range: upstream HydraGNN's normalisation of LSMS targets) or ``"standard"``
(the mean and the standard deviation); a constant column keeps scale 1. The model then predicts
``shift + scale * network(h)`` and trains on the normalised error, and the artifact, which keeps
the values, predicts in the data's units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hydragnn.data import Schema
from hydragnn.models import ModelConfig
from hydragnn.models.loss import targets
from hydragnn.models.schema_checks import mlip_roles

__all__ = ["fill_output_scaling", "output_statistics"]


def output_statistics(
    schema: Schema, trainset: Sequence[Any], method: str, skip: Sequence[str] = ()
) -> dict[str, dict[str, list[float]]]:
    """``{output: {"shift": [dim], "scale": [dim]}}`` over the rows of ``trainset`` (prepared samples)."""
    rows: dict[str, list[torch.Tensor]] = {}
    for sample in trainset:
        for name, value in targets(sample, schema).items():
            if name not in skip:
                rows.setdefault(name, []).append(value.detach().reshape(-1, value.shape[-1]).double())
    out = {}
    for name, parts in rows.items():
        values = torch.cat(parts)
        if method == "minmax":
            low, high = values.min(dim=0).values, values.max(dim=0).values
            shift, scale = low, high - low
        else:
            shift, scale = values.mean(dim=0), values.std(dim=0, unbiased=False)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        out[name] = {"shift": shift.tolist(), "scale": scale.tolist()}
    return out


def fill_output_scaling(
    model_config: ModelConfig, schema: Schema, trainset: Sequence[Any], method: str | None
) -> ModelConfig:
    """``model_config`` with ``output_scaling`` from the training split (``method``: the
    ``Training.normalize_outputs`` value); itself when ``method`` is None or the config gives one."""
    if method is None or model_config.output_scaling or not trainset:
        return model_config
    skip = list(mlip_roles(model_config, schema).values()) if model_config.mlip.enabled else []
    scaling = output_statistics(schema, trainset, method, skip)
    return ModelConfig.from_dict({**model_config.raw, "output_scaling": scaling}) if scaling else model_config
