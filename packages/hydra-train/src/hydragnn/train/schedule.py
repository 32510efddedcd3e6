"""Callbacks that change a run besides the scheduler: LR warmup, the second stage, performer
redraws, the time budget (each a :class:`~hydragnn.train.callbacks.Callback`).

* :class:`Warmup` scales the learning rate of the first ``warmup_steps`` optimizer steps by
  ``(k + 1) / warmup_steps`` around the step only: the value the scheduler keeps in the
  optimizer is never changed, so epoch-level schedulers see their own values.
* :class:`SecondStage` switches, once, to a constant learning rate and new MLIP loss weights
  (MACE's stage two), at the first epoch boundary past ``start`` of the epochs or of the time
  budget; the best model is then chosen among second-stage epochs and the scheduler rests.
* :class:`ProjectionRedraw` redraws performer projections every ``global_attn_redraw_interval``
  training batches, by the loop's batch count (which the checkpoint keeps).
* :class:`TimeBudget` stops at the epoch boundary where another epoch of the length of the last
  one would overrun ``max_time_s`` (the whole run's, resumed segments included).

Decisions that depend on time use rank 0's clock (:func:`rank0_values`), so every rank of a
distributed run decides alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from hydragnn.models import redraw_projections

from .callbacks import Callback
from .config_sections import SecondStageConfig
from .strategies.base import Strategy

if TYPE_CHECKING:
    from .callbacks import LoopView

__all__ = ["ProjectionRedraw", "SecondStage", "TimeBudget", "Warmup", "rank0_values"]


def rank0_values(strategy: Strategy, *values: float) -> list[float]:
    """``values`` as rank 0 has them, on every rank (one all-reduce under torch.distributed)."""
    t = torch.tensor(values, dtype=torch.float64)
    if strategy.distributed:
        t = strategy.all_reduce_sum(t * (1.0 if strategy.is_main else 0.0))
    return [float(v) for v in t]


class Warmup(Callback):
    """Linear learning-rate warmup over the first ``steps`` optimizer steps.

    Args:
        steps: warmup length in optimizer steps (0: off).
        done: steps already taken.
    """

    key = "warmup"

    def __init__(self, steps: int, done: int = 0) -> None:
        self.steps, self.done = steps, done
        self._saved: list[float] | None = None

    @property
    def active(self) -> bool:
        return self.done < self.steps

    def before_step(self, loop: LoopView) -> None:
        """Scale every group's learning rate for the coming step."""
        if not self.active:
            return
        factor = (self.done + 1) / self.steps
        groups = loop.optimizer.param_groups
        self._saved = [group["lr"] for group in groups]
        for group, lr in zip(groups, self._saved, strict=True):
            group["lr"] = lr * factor

    def after_step(self, loop: LoopView, graphs: int, loss: float) -> None:
        """Restore the scheduled learning rates and count the step."""
        if self._saved is not None:
            for group, lr in zip(loop.optimizer.param_groups, self._saved, strict=True):
                group["lr"] = lr
            self._saved = None
        if self.active:
            self.done += 1

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.done = int(state["done"])


class SecondStage(Callback):
    """The switch to the second stage.

    Args:
        config: ``Training.SecondStage``.
        num_epoch: ``Training.num_epoch``.
        max_time_s: ``Training.max_time_s`` (or ``None``).

    Attributes:
        epoch: the epoch it began at (``None`` before); the checkpoint keeps it.
    """

    key = "second_stage"

    def __init__(self, config: SecondStageConfig, num_epoch: int, max_time_s: float | None) -> None:
        self.config, self.num_epoch, self.max_time_s = config, num_epoch, max_time_s
        self.epoch: int | None = None

    @property
    def started(self) -> bool:
        return self.epoch is not None

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

    def apply(self, optimizer: torch.optim.Optimizer, model: Any) -> dict[str, tuple[float, float]]:
        """Set the learning rate and the loss weights (``model.task_weights`` of the MLIP roles).

        Returns:
            ``{output name: (first-stage weight, new weight)}``.
        """
        if self.config.learning_rate is not None:
            for group in optimizer.param_groups:
                group["lr"] = self.config.learning_rate
        return self.reweigh(model)

    def reweigh(self, model: Any) -> dict[str, tuple[float, float]]:
        """Only the loss weights (what a resumed second stage re-applies to the first stage's
        weights of a freshly built model; the lr is in the optimizer): a ``*_weight`` replaces the
        role's weight, a ``*_factor`` multiplies it."""
        special = getattr(model, "special", {}) or {}
        changed = {}
        for role, weight in [*self.config.weights.items(), *self.config.factors.items()]:
            name = special.get(role)
            if name is None or name not in model.task_weights:
                continue
            old = float(model.task_weights[name])
            new = float(weight) if role in self.config.weights else old * float(weight)
            model.task_weights[name] = new
            changed[name] = (old, new)
        return changed

    @staticmethod
    def _describe(changed: Mapping[str, tuple[float, float]]) -> str:
        parts = [f"{name} {old:g} -> {new:g}" for name, (old, new) in changed.items() if old != new]
        return "loss weights " + (", ".join(parts) if parts else "unchanged")

    def on_fit_start(self, loop: LoopView) -> None:
        if self.started:  # resumed inside the second stage
            self.reweigh(loop.module)
            loop.step_scheduler = False

    def on_epoch_start(self, loop: LoopView, epoch: int) -> None:
        if not self.config.enabled or self.started:
            return
        elapsed = rank0_values(loop.strategy, loop.train_time_s())[0] if self.max_time_s is not None else 0.0
        if not self.due(epoch, elapsed):
            return
        changed = self.apply(loop.optimizer, loop.module)
        self.epoch, loop.step_scheduler = epoch, False
        loop.best_loss, loop.since_best = math.inf, 0
        others = sorted(set(loop.module.task_weights) - set(changed)) if hasattr(loop.module, "task_weights") else []
        loop.log(
            f"second stage from epoch {epoch}: learning rate {loop.optimizer.param_groups[0]['lr']:.3g} (constant), "
            f"{self._describe(changed)}{f' ({others} kept)' if others else ''}; the best model is now chosen among "
            "second-stage epochs"
        )

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        record["second_stage"] = self.started

    def on_fit_end(self, loop: LoopView) -> None:
        for line in self.worse_heads(loop.history, loop.best_epoch):
            loop.log(f"warning: {line}")

    def worse_heads(self, history: list[dict[str, Any]], kept_epoch: int) -> list[str]:
        """Heads whose validation MAE at the kept epoch is above that of the last first-stage epoch."""
        if self.epoch is None:
            return []
        by_epoch = {int(r["epoch"]): r for r in history}
        before, after = by_epoch.get(self.epoch - 1), by_epoch.get(kept_epoch)
        if before is None or after is None or kept_epoch < self.epoch:
            return []
        lines = []
        for name, err in (after.get("val_errors") or {}).items():
            first = (before.get("val_errors") or {}).get(name)
            if first is None or not float(err["mae"]) > float(first["mae"]):
                continue
            lines.append(
                f"head {name!r} ends worse than before the second stage: validation MAE {float(err['mae']):.4g} at "
                f"epoch {kept_epoch}, {float(first['mae']):.4g} at epoch {self.epoch - 1} (the second stage's loss "
                "weights favour other heads: lower its *_factor / *_weight, or disable Training.SecondStage)"
            )
        return lines

    def summary(self) -> dict[str, int | None]:
        return {"second_stage_epoch": self.epoch}

    def state_dict(self) -> dict[str, int | None]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch = None if state.get("epoch") is None else int(state["epoch"])


class TimeBudget(Callback):
    """``Training.max_time_s`` against the run's training time (:meth:`TrainingLoop.train_time_s`,
    resumed segments included): stop at the epoch boundary where one more epoch of the length of
    the last would overrun it; a resumed run whose budget is spent trains no epoch."""

    key = "time_budget"

    def __init__(self, max_time_s: float, num_epoch: int) -> None:
        self.max_time_s, self.num_epoch = max_time_s, num_epoch

    def check(self, loop: LoopView, last_epoch_s: float) -> tuple[float, bool]:
        """Rank 0's elapsed time and whether one more epoch of ``last_epoch_s`` would overrun."""
        elapsed, last = rank0_values(loop.strategy, loop.train_time_s(), last_epoch_s)
        return elapsed, elapsed + last > self.max_time_s

    def on_fit_start(self, loop: LoopView) -> None:
        if not (loop.resumed and loop.history and loop.start_epoch < self.num_epoch):
            return
        last = loop.history[-1].get("seconds", 0.0)
        elapsed, out_of_time = self.check(loop, last)
        if out_of_time:
            loop.request_stop(
                "max_time_s",
                f"time budget spent: {elapsed:.1f} s of max_time_s={self.max_time_s:g} s used, too little left for "
                f"another epoch (the last took {last:.1f} s), so none is trained; raise "
                "NeuralNetwork.Training.max_time_s to train more",
            )

    def on_epoch_end(self, loop: LoopView, record: dict[str, Any]) -> None:
        if loop.stop_reason is not None or record["epoch"] + 1 >= self.num_epoch:
            return
        elapsed, out_of_time = self.check(loop, record["seconds"])
        if out_of_time:
            loop.request_stop(
                "max_time_s",
                f"time budget max_time_s={self.max_time_s:g} s: stopping after epoch {record['epoch']} ({elapsed:.1f} s "
                f"used, the last epoch took {record['seconds']:.1f} s); the best model is kept",
            )


class ProjectionRedraw(Callback):
    """Redraws performer projections every ``interval`` training batches.

    Right before the forward of training batch ``count`` (the loop's
    :attr:`~TrainingLoop.train_batches`, resumed runs included) whenever ``count > 0`` and
    ``count % interval == 0``, from ``(seed, count // interval)``: every rank draws the same.
    Counting in the loop, outside the model's forward, means activation checkpointing (which
    repeats a forward) never double-counts.

    Args:
        interval: ``Training.global_attn_redraw_interval`` (``None``: never redraw).
        seed: ``Training.seed`` (the same on every rank).

    Attributes:
        redraws: redraws done by this object (a model without performer modules has none).
    """

    key = "projection_redraw"

    def __init__(self, interval: int | None, seed: int) -> None:
        self.interval, self.seed = interval, seed
        self.redraws = 0

    def before_forward(self, loop: LoopView, batch_index: int) -> None:
        count = loop.train_batches
        if self.interval is None or count == 0 or count % self.interval:
            return
        self.redraws += bool(redraw_projections(loop.module, self.seed, count // self.interval))

    def summary(self) -> dict[str, int]:
        return {"projection_redraws": self.redraws}
