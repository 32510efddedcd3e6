"""``Committee``: K independently initialised models trained side by side, served as their mean.

A committee (``Architecture.committee: K``) holds K :class:`~hydragnn.models.model.HydraModel`
members built from the same section, each from its own draw of the global RNG. Served, it is one
model: ``forward`` returns each output averaged over the members (forces and stress included:
the derivative of the mean energy is the mean of the derivatives), and it offers the attributes
the trainer, the calculator and the artifact read from a ``HydraModel`` (``config``, ``schema``,
``special``, ``cutoff``, ``dtype``, ...). Trained, every member fits the targets on its own: in
training mode ``forward`` also returns the members' predictions stacked under
``"<name>@members"`` (``[K, rows, dim]``) and :meth:`loss` is the mean of the members' losses,
so no member learns to correct another (a loss on the mean would train one wide model, not K).
Validation and test losses are the loss of the mean. The spread of the members
(:meth:`member_outputs`) is a cheap error estimate on structures unlike the training data: with
``with_spread`` set, the evaluation-mode ``forward`` also returns it, ``"<name>@spread"``, the
members' standard deviation of every output (same shape as the output), in the same pass.

Why: on small training sets the error on unseen chemistry varies more between seeds than
between settings; averaging K members cancels that variance (docs/notes/organic_benchmark.md).
It costs K times the compute per structure, in training and in serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch import nn
from torch_geometric.data import Data

from hydragnn.data import Schema

from .config import ModelConfig
from .errors import ModelError
from .model import HydraModel

if TYPE_CHECKING:
    from .encoders import EncoderDims
    from .mlip import EnergyHead

MEMBERS_SUFFIX = "@members"
"""Suffix of the training-mode outputs holding the members' stacked predictions."""
SPREAD_SUFFIX = "@spread"
"""Suffix of the evaluation-mode outputs holding the members' spread (with ``with_spread``)."""


def member_predictions(outputs: Mapping[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Member ``k``'s predictions in a training-mode committee output (its rows of every
    ``"<name>@members"``), under the plain output names (what ``HydraModel.loss`` reads)."""
    return {n[: -len(MEMBERS_SUFFIX)]: v[k] for n, v in outputs.items() if n.endswith(MEMBERS_SUFFIX)}


def member_config(config: ModelConfig) -> ModelConfig:
    """The section of one member: ``config`` with ``committee`` 1 (also in ``raw``)."""
    raw = {k: v for k, v in config.raw.items() if k != "committee"}
    return dataclasses.replace(config, committee=1, raw=raw)


class Committee(nn.Module):
    """K :class:`HydraModel` members averaged (see the module docstring).

    Args:
        config: the ``Architecture`` section with ``committee`` K >= 2.
        schema: the schema every member predicts.
    """

    def __init__(self, config: ModelConfig, schema: Schema) -> None:
        super().__init__()
        if config.committee < 2:
            raise ModelError(f"a Committee needs committee >= 2 members, found {config.committee}")
        self.config = config
        one = member_config(config)
        self.members = nn.ModuleList(HydraModel(one, schema) for _ in range(config.committee))
        # One loss-weight dict for all members: what changes the committee's ``task_weights`` (the
        # second stage's reweighting) changes every member's loss, not member 0's alone.
        for member in self._models[1:]:
            member.task_weights = self.first.task_weights
        self.with_spread = False  # evaluation: also return each output's spread over the members

    @property
    def _models(self) -> Sequence[HydraModel]:
        """``members`` as what it holds (an ``nn.ModuleList`` types its items as ``nn.Module``)."""
        return cast("Sequence[HydraModel]", self.members)

    # ------------------------------------------------------------------ what a HydraModel offers
    @property
    def first(self) -> HydraModel:
        """Member 0 (the one the shared, non-weight attributes are read from)."""
        return self._models[0]

    @property
    def schema(self) -> Schema:
        return self.first.schema

    @property
    def mlip(self) -> bool:
        return self.first.mlip

    @property
    def geometric(self) -> bool:
        return self.first.geometric

    @property
    def special(self) -> dict[str, str]:
        return self.first.special

    @property
    def dims(self) -> EncoderDims:
        return self.first.dims

    @property
    def task_weights(self) -> dict[str, float]:
        """The loss weights, one dict shared by every member (a change reaches all of them)."""
        return self.first.task_weights

    @property
    def dtype(self) -> torch.dtype:
        return self.first.dtype

    @property
    def geometry_dtype(self) -> torch.dtype:
        return self.first.geometry_dtype

    @property
    def cutoff(self) -> float:
        return self.config.radius

    @property
    def energy_head(self) -> EnergyHead | None:
        """Member 0's energy head (its ``default_head`` is every member's: :meth:`select_head`)."""
        return self.first.energy_head

    @property
    def energy_head_names(self) -> list[str]:
        return self.first.energy_head_names

    @property
    def head_weights(self) -> torch.Tensor | None:
        return self.first.head_weights

    @head_weights.setter
    def head_weights(self, value: torch.Tensor | None) -> None:
        for member in self._models:
            member.head_weights = value

    def select_head(self, name: str) -> None:
        """Use energy head ``name`` in every member (see :meth:`HydraModel.select_head`)."""
        for member in self._models:
            member.select_head(name)

    # ------------------------------------------------------------------ forward and loss
    def member_outputs(
        self, batch: Data, *, compute_forces: bool | None = None, compute_stress: bool | None = None
    ) -> list[dict[str, torch.Tensor]]:
        """Each member's predictions (``HydraModel.forward``), in member order."""
        return [m(batch, compute_forces=compute_forces, compute_stress=compute_stress) for m in self.members]

    def forward(
        self, batch: Data, *, compute_forces: bool | None = None, compute_stress: bool | None = None
    ) -> dict[str, torch.Tensor]:
        """The members' mean of every output (``HydraModel.forward``'s names and shapes); in
        training mode also ``"<name>@members"``: the stacked predictions ``[K, rows, dim]``; in
        evaluation mode with :attr:`with_spread`, ``"<name>@spread"``: the members' standard
        deviation (population, over K) of each value, the output's shape."""
        outs = self.member_outputs(batch, compute_forces=compute_forces, compute_stress=compute_stress)
        mean: dict[str, torch.Tensor] = {}
        for name in outs[0]:
            stacked = torch.stack([o[name] for o in outs])
            mean[name] = stacked.mean(0)
            if self.training:
                mean[name + MEMBERS_SUFFIX] = stacked
            elif self.with_spread:
                mean[name + SPREAD_SUFFIX] = stacked.std(0, correction=0)
        return mean

    def loss(self, outputs: Mapping[str, torch.Tensor], batch: Data) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The mean of the members' losses when ``outputs`` holds their stacked predictions
        (training), else the loss of the mean prediction (:meth:`HydraModel.loss`)."""
        if not any(name.endswith(MEMBERS_SUFFIX) for name in outputs):
            return self.first.loss(outputs, batch)
        totals, parts = [], []
        for k, member in enumerate(self._models):
            total, heads = member.loss(member_predictions(outputs, k), batch)
            totals.append(total)
            parts.append(heads)
        count = len(self.members)
        # sums of K >= 2 tensors: tensors
        heads = {name: cast(torch.Tensor, sum(p[name] for p in parts)) / count for name in parts[0]}
        return cast(torch.Tensor, sum(totals)) / count, heads
