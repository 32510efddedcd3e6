"""What changes during a run besides the scheduler: LR warmup, the second stage, the time budget.

* :class:`Warmup` scales the learning rate of the first ``warmup_steps`` optimizer steps by
  ``(k + 1) / warmup_steps`` around the step only: the value the scheduler keeps in the
  optimizer is never changed, so epoch-level schedulers see their own values.
* :class:`SecondStage` switches, once, to a constant learning rate and new MLIP loss weights
  (MACE's stage two), at the first epoch boundary past ``start`` of the epochs or of the time
  budget.
* :class:`ProjectionRedraw` counts training batches and redraws performer projections every
  ``global_attn_redraw_interval`` of them.
* :class:`TimeBudget` says, at an epoch boundary, whether another epoch of the length of the
  last one would overrun ``max_time_s`` (the whole run's, resumed segments included); under
  torch.distributed every rank gets rank 0's answer.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from hydragnn.models import redraw_projections

from .config_sections import SecondStageConfig
from .strategies.base import Strategy

__all__ = ["ProjectionRedraw", "SecondStage", "TimeBudget", "Warmup"]


class Warmup:
    """Linear learning-rate warmup over the first ``steps`` optimizer steps.

    Args:
        optimizer: the optimizer whose param groups are scaled.
        steps: warmup length in optimizer steps (0: off).
        done: steps already taken (from a checkpoint).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int, done: int = 0) -> None:
        self.optimizer, self.steps, self.done = optimizer, steps, done
        self._saved: list[float] | None = None

    @property
    def active(self) -> bool:
        return self.done < self.steps

    def before_step(self) -> None:
        """Scale every group's learning rate for the coming step."""
        if not self.active:
            return
        factor = (self.done + 1) / self.steps
        self._saved = [group["lr"] for group in self.optimizer.param_groups]
        for group, lr in zip(self.optimizer.param_groups, self._saved, strict=True):
            group["lr"] = lr * factor

    def after_step(self) -> None:
        """Restore the scheduled learning rates and count the step."""
        if self._saved is not None:
            for group, lr in zip(self.optimizer.param_groups, self._saved, strict=True):
                group["lr"] = lr
            self._saved = None
        if self.active:
            self.done += 1


class SecondStage:
    """The switch to the second stage.

    Args:
        config: ``Training.SecondStage``.
        num_epoch: ``Training.num_epoch``.
        max_time_s: ``Training.max_time_s`` (or ``None``).
        started: whether a checkpoint says it has begun already.
    """

    def __init__(self, config: SecondStageConfig, num_epoch: int, max_time_s: float | None, started: bool = False):
        self.config, self.num_epoch, self.max_time_s = config, num_epoch, max_time_s
        self.started = started

    @property
    def first_epoch(self) -> int:
        """The epoch it begins at by count (``ceil(start * num_epoch)``)."""
        return math.ceil(self.config.start * self.num_epoch)

    def due(self, epoch: int, elapsed_s: float) -> bool:
        """Whether it should begin before ``epoch`` (after ``elapsed_s`` of training)."""
        if not self.config.enabled or self.started:
            return False
        by_time = self.max_time_s is not None and elapsed_s >= self.config.start * self.max_time_s
        return epoch >= self.first_epoch or by_time

    def apply(self, optimizer: torch.optim.Optimizer, model: Any) -> dict[str, float]:
        """Set the learning rate and the loss weights (``model.task_weights`` of the MLIP roles).

        Returns:
            ``{output name: new weight}``.
        """
        if self.config.learning_rate is not None:
            for group in optimizer.param_groups:
                group["lr"] = self.config.learning_rate
        return self.reweigh(model)

    def reweigh(self, model: Any) -> dict[str, float]:
        """Only the loss weights (what a resumed second stage re-applies; the lr is in the optimizer)."""
        special = getattr(model, "special", {}) or {}
        changed = {}
        for role, weight in self.config.weights.items():
            name = special.get(role)
            if name is not None:
                model.task_weights[name] = weight
                changed[name] = weight
        return changed


class TimeBudget:
    """``Training.max_time_s`` against the run's training time: ``used_s`` of its earlier
    (resumed) segments plus this segment's, measured from construction."""

    def __init__(self, max_time_s: float | None, used_s: float = 0.0) -> None:
        self.max_time_s, self.used_s = max_time_s, float(used_s)
        self.t0 = time.perf_counter()

    @property
    def elapsed(self) -> float:
        """Seconds of training over the whole run so far."""
        return self.used_s + time.perf_counter() - self.t0

    def check(self, last_epoch_s: float, strategy: Strategy) -> tuple[float, bool]:
        """Rank 0's elapsed time and whether one more epoch of ``last_epoch_s`` would overrun the
        budget (every rank gets rank 0's values, so all decide alike)."""
        values = torch.tensor([self.elapsed, float(last_epoch_s)], dtype=torch.float64)
        if strategy.distributed:
            values = strategy.all_reduce_sum(values * (1.0 if strategy.is_main else 0.0))
        elapsed, last = float(values[0]), float(values[1])
        return elapsed, self.max_time_s is not None and elapsed + last > self.max_time_s


class ProjectionRedraw:
    """Training-batch counter that redraws performer projections every ``interval`` batches.

    Args:
        model: the plain model (its :class:`~hydragnn.models.attention.PerformerAttention`
            modules are redrawn; a model without any is left alone).
        interval: ``Training.global_attn_redraw_interval`` (``None``: never redraw).
        seed: ``Training.seed`` (the same on every rank).
        batches: training batches already counted (from a checkpoint when resuming).

    Attributes:
        batches: training batches counted so far; redraws: redraws done by this object.
    """

    def __init__(self, model: nn.Module, interval: int | None, seed: int, batches: int = 0) -> None:
        self.model = model
        self.interval = interval
        self.seed = seed
        self.batches = batches
        self.redraws = 0

    def before_forward(self) -> int:
        """Call right before the forward of a training batch: redraws when the interval is
        reached. Returns the number of performer modules redrawn (0 when none or not due)."""
        if self.interval is None or self.batches == 0 or self.batches % self.interval:
            return 0
        redrawn = redraw_projections(self.model, self.seed, self.batches // self.interval)
        self.redraws += bool(redrawn)
        return redrawn

    def after_batch(self) -> None:
        """Call once per training batch after its forward (skipped batches count too)."""
        self.batches += 1
