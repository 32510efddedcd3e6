"""The training loop, :class:`TrainingLoop`: what every run does.

Per epoch, ``set_epoch`` on the training loader, one pass of training steps through the strategy
(a non-finite loss stops with :class:`TrainingAborted` naming the epoch and batch, or skips the
batch under ``nan_policy: "skip"``), validation losses and errors per head in physical units
(averaged across ranks), the scheduler step (``ReduceLROnPlateau`` on the validation loss), the
best model by validation loss (kept in memory and in the checkpoint), and an atomic checkpoint
every ``Checkpoint.every`` epochs after ``Checkpoint.warmup``. ``resume`` continues from the
checkpoint and ends with the same parameters as an uninterrupted run. At the end the callbacks
may offer another state (``on_training_end``), the best state is restored and reported, and the
test set evaluated.

Everything else is a :class:`~hydragnn.train.callbacks.Callback`
(:func:`hydragnn.train.fit.builtin_callbacks` builds those the ``Training`` section asks
for); the loop never branches on which callbacks run. The checkpoint keeps ``{"callbacks": {key:
state}}``. :func:`~hydragnn.train.seed_api.train_validate_test` (the seed API) drives it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from hydragnn.data.loaders import set_epoch
from hydragnn.models.metrics import format_errors

from .callbacks import Callback, check_unique, nested
from .checkpoint import atomic_save, get_rng_state, load_checkpoint, set_rng_state
from .config import TrainingConfig
from .epoch import train_epoch as _train_epoch  # a module global: profilers and harnesses wrap it
from .errors import CheckpointError, TrainingAborted
from .evaluate import evaluate_losses, gather_rows, head_units, mae_report
from .progress import Progress, fmt_errors, fmt_losses
from .run_folder import check_fingerprint
from .strategies.base import Strategy

__all__ = ["CHECKPOINT_NAME", "TrainingLoop"]

CHECKPOINT_NAME = "checkpoint.pt"


def _lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def _scheduler_step(scheduler: Any, val_loss: float) -> None:
    if scheduler is None:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(val_loss)
    else:
        scheduler.step()


def _clone_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def _legacy_states(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """Callback states of a checkpoint written before callbacks had their own section."""
    states: dict[str, Any] = {
        "warmup": {"done": ckpt.get("warmup_done", 0)},
        "second_stage": {"epoch": ckpt.get("second_stage_epoch")},
    }
    if "ema" in ckpt:
        states["ema"] = ckpt["ema"]
    return states


class TrainingLoop:
    """One training run's state and its epochs (what :func:`train_validate_test` drives).

    Callbacks read and change it: ``cfg`` (the ``TrainingConfig``), ``strategy``, ``module`` (the
    plain model), ``optimizer``, ``scheduler``, ``epoch`` (the current one), ``start_epoch``,
    ``history`` (per-epoch records), ``best_loss`` / ``best_epoch`` / ``since_best``,
    ``train_batches`` (training forwards over the run, resumed segments included),
    ``step_scheduler`` (cleared by the second stage), ``resumed``, :meth:`train_time_s`,
    :meth:`log` and :meth:`request_stop`. The checkpoint keeps the loop's counters, the model,
    optimizer, scheduler, RNG and best state, and ``{"callbacks": {key: state}}``.
    """

    def __init__(
        self,
        cfg: TrainingConfig,
        strategy: Strategy,
        scheduler: Any,
        progress: Progress,
        ckpt_path: Path,
        callbacks: Sequence[Callback],
        fingerprint: Mapping[str, Any] | None = None,
    ) -> None:
        check_unique(callbacks)
        self.cfg, self.strategy, self.scheduler, self.progress = cfg, strategy, scheduler, progress
        self.module = strategy.unwrap()
        self.optimizer = cast(torch.optim.Optimizer, strategy.optimizer)  # a set-up strategy has its optimizer
        self.ckpt_path, self.callbacks, self.fingerprint = ckpt_path, list(callbacks), fingerprint
        self.history: list[dict[str, Any]] = []
        self.best_loss, self.best_epoch, self.best_state = math.inf, -1, None
        self.epoch, self.start_epoch, self.since_best = -1, 0, 0
        self.skipped_batches, self.seen_batches, self.train_batches = 0, 0, 0
        self.step_scheduler, self.resumed = True, False
        self.stop_reason: str | None = None
        self.best_kind = "weights"
        self._val_loader: Any = None
        self._stop_message = ""
        self._used_s, self._t0 = 0.0, time.perf_counter()

    # ------------------------------------------------------------------ what callbacks use
    def log(self, line: str) -> None:
        """One line on the console and in the run log (rank 0)."""
        self.progress.log(1, line)

    def train_time_s(self) -> float:
        """Seconds of training over the whole run so far, resumed segments included (this rank's clock)."""
        return self._used_s + time.perf_counter() - self._t0

    def validation_loss(self) -> float | None:
        """The validation loss of the model as it is now (averaged across ranks); ``None``
        without a validation set or outside :meth:`run`."""
        return None if self._val_loader is None else evaluate_losses(self.strategy, self._val_loader)[0]

    def keep_state(self, state: dict[str, torch.Tensor], loss: float, epoch: int, kind: str) -> None:
        """Make ``state`` (validated at ``loss``, from ``epoch``) the one restored and saved; ``kind``
        names it in the log and in the summary's ``kept_weights``."""
        self.best_state, self.best_loss, self.best_epoch, self.best_kind = state, loss, epoch, kind

    def live_state(self) -> dict[str, torch.Tensor]:
        """A copy of the model's parameters and buffers as they are now (on the CPU)."""
        return _clone_state(self.strategy.model_state_dict())

    def request_stop(self, reason: str, message: str) -> None:
        """End training after the current epoch (before the first, from ``on_fit_start``); the
        first request wins. Every rank must request alike."""
        if self.stop_reason is None:
            self.stop_reason, self._stop_message = reason, message

    # ------------------------------------------------------------------ resume
    def resume(self) -> None:
        """Restore the run from :attr:`ckpt_path` (model, optimizer, scheduler, counters, RNG, callbacks).

        Raises:
            CheckpointError: no readable training checkpoint, a different fingerprint, or states
                that do not fit this model / optimizer / callbacks.
        """
        path = self.ckpt_path
        ckpt = load_checkpoint(path)
        if not isinstance(ckpt, dict) or "model" not in ckpt or "epoch" not in ckpt:
            raise CheckpointError(f"{path}: not a training checkpoint (no 'model' / 'epoch')")
        if self.fingerprint is not None:
            check_fingerprint(ckpt.get("fingerprint"), self.fingerprint, str(path))
        states = ckpt.get("callbacks")
        states = _legacy_states(ckpt) if states is None else states
        try:
            self.strategy.load_model_state_dict(ckpt["model"])
            if ckpt.get("optimizer") is not None:
                self.strategy.load_optimizer_state_dict(ckpt["optimizer"])
            if self.scheduler is not None and ckpt.get("scheduler") is not None:
                self.scheduler.load_state_dict(ckpt["scheduler"])
            self._load_callback_states(states)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: does not fit this model / optimizer / callbacks: {exc}") from exc
        self.start_epoch = int(ckpt["epoch"]) + 1
        self.best_loss, self.best_epoch = float(ckpt["best_val_loss"]), int(ckpt["best_epoch"])
        self.best_state, self.since_best = ckpt["best_state"], int(ckpt["since_best"])
        self.skipped_batches = int(ckpt["skipped_batches"])
        self.seen_batches = int(ckpt.get("seen_batches", 0))
        self.train_batches = int(ckpt.get("train_batches", 0))
        self.history = list(ckpt["history"])
        set_rng_state(ckpt["rng"])
        # a checkpoint written before train_time_s was stored: the epochs' own seconds
        self._used_s = float(ckpt.get("train_time_s", sum(h.get("seconds", 0.0) for h in self.history)))
        self.resumed = True
        max_time = self.cfg.max_time_s
        left = "" if max_time is None else f"; {max(max_time - self._used_s, 0.0):.1f} s of max_time_s left"
        self.log(f"resumed from {path} after epoch {self.start_epoch - 1} ({self._used_s:.1f} s trained{left})")

    def _load_callback_states(self, states: Mapping[str, Any]) -> None:
        names = {cb.name for cb in self.callbacks}
        for cb in self.callbacks:
            if cb.name in states:
                cb.load_state_dict(states[cb.name])
            elif cb.state_dict() is not None:
                self.log(f"the checkpoint holds no state of callback {cb.name!r}: it starts afresh")
        ignored = sorted(set(states) - names)
        if ignored:
            self.log(f"the checkpoint's states of callbacks {ignored} are not used: no such callback in this run")

    # ------------------------------------------------------------------ the run
    def run(self, train_loader: Any, val_loader: Any, test_loader: Any, log_name: str) -> dict[str, Any]:
        """Train from :attr:`start_epoch`, restore the best state, test; returns the summary
        (see :func:`train_validate_test`)."""
        self._t0 = time.perf_counter()
        self.strategy.begin_training()
        try:
            for cb in self.callbacks:
                cb.on_fit_start(self)
            self.log(
                f"training {log_name}: {self.cfg.num_epoch} epochs, {len(train_loader)} batches per epoch per rank"
            )
            if self.stop_reason is not None:
                self.log(self._stop_message)
            else:
                for epoch in range(self.start_epoch, self.cfg.num_epoch):
                    self._epoch(epoch, train_loader, val_loader)
                    if self.stop_reason is not None:
                        self.log(self._stop_message)
                        break
            self._val_loader = val_loader
            for cb in self.callbacks:
                cb.on_training_end(self)
            summary = self._restore_best()
            if test_loader is not None:
                self._test(test_loader, summary)
            return summary
        finally:
            self.strategy.end_training()
            for cb in self.callbacks:
                cb.on_fit_end(self)

    def _epoch(self, epoch: int, train_loader, val_loader) -> None:
        t0 = time.perf_counter()
        self.epoch = epoch
        for cb in self.callbacks:
            cb.on_epoch_start(self, epoch)
        set_epoch(train_loader, epoch)
        train_loss, train_heads, skipped, gps = _train_epoch(
            self.strategy, train_loader, epoch, self.cfg.nan_policy, self.progress, self
        )
        self._count_skipped(skipped, len(train_loader), epoch)
        with nested([cb.evaluating(self) for cb in self.callbacks]):
            val_loss, val_heads, val_errors = self._validate(val_loader, train_loss, train_heads)
            improved = val_loss < self.best_loss
            if improved:
                self.best_loss, self.best_epoch, self.since_best = val_loss, epoch, 0
                self.best_state = _clone_state(self.strategy.model_state_dict())
            else:
                self.since_best += 1
        lr = _lr(self.optimizer)
        if self.step_scheduler:
            _scheduler_step(self.scheduler, val_loss)
        record = {
            "epoch": epoch,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "train_heads": train_heads,
            "val_heads": val_heads,
            "val_errors": val_errors,
            "lr": lr,
            "skipped_batches": skipped,
            "graphs_per_s": gps,
            "seconds": time.perf_counter() - t0,
        }
        for cb in self.callbacks:
            cb.on_epoch_end(self, record)
        self.history.append(record)
        self.progress.log(
            2,
            f"epoch {epoch}: loss train {train_loss:.4g} val {val_loss:.4g}"
            + (f" | val MAE {fmt_errors(val_errors)}" if val_errors else f" ({fmt_losses(train_heads)})")
            + f" | lr {lr:.3g} | {gps:.1f} graphs/s | {record['seconds']:.1f} s{' *' if improved else ''}",
        )
        ck = self.cfg.checkpoint
        last = self.stop_reason is not None or epoch + 1 == self.cfg.num_epoch
        if ck.enabled and epoch + 1 >= ck.warmup and ((epoch + 1) % ck.every == 0 or last):
            self._checkpoint(epoch)

    def _count_skipped(self, skipped: int, batches: int, epoch: int) -> None:
        self.skipped_batches += skipped
        self.seen_batches += batches
        if self.skipped_batches > self.cfg.max_skipped_fraction * self.seen_batches:
            raise TrainingAborted(
                f"{self.skipped_batches} of {self.seen_batches} training batches so far had a non-finite loss and were "
                f"skipped (more than max_skipped_fraction={self.cfg.max_skipped_fraction:g}) at epoch {epoch}: the "
                "model is diverging; lower the learning rate, clip gradients (clip_grad_norm) or check the data. No "
                "artifact was written"
            )

    def _validate(self, val_loader, train_loss: float, train_heads: dict[str, float]):
        """(loss, {head: loss}, errors per head or None); without a validation set, the training loss."""
        if val_loader is None:
            return train_loss, train_heads, None
        val_loss, val_heads, _, _, extras = evaluate_losses(self.strategy, val_loader)
        return val_loss, val_heads, extras["errors"]

    def _checkpoint(self, epoch: int) -> None:
        """Write the training state atomically (rank 0), then wait for every rank."""
        state = {
            "model": _clone_state(self.strategy.model_state_dict()),
            "optimizer": self.strategy.optimizer_state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "epoch": epoch,
            "best_val_loss": self.best_loss,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "since_best": self.since_best,
            "skipped_batches": self.skipped_batches,
            "seen_batches": self.seen_batches,
            "train_batches": self.train_batches,
            "history": self.history,
            "train_time_s": self.train_time_s(),
            "rng": get_rng_state(),
            "fingerprint": dict(self.fingerprint) if self.fingerprint is not None else None,
            "callbacks": {cb.name: state for cb in self.callbacks if (state := cb.state_dict()) is not None},
        }
        if self.strategy.is_main:
            atomic_save(state, self.ckpt_path)
        self.strategy.barrier()

    def _restore_best(self) -> dict[str, Any]:
        """Load the best state into the model; the summary without the test entries."""
        if self.best_epoch < 0 and self.history:
            raise TrainingAborted(
                f"no epoch of {len(self.history)} reached a finite validation loss (last: "
                f"{self.history[-1]['val_loss']}); {self.skipped_batches} batch(es) were skipped for a non-finite "
                "loss. No artifact was written"
            )
        if self.best_state is not None:
            self.strategy.load_model_state_dict(self.best_state)
            self.log(f"best epoch {self.best_epoch} (val loss {self.best_loss:.6g}); its {self.best_kind} are restored")
        if self.skipped_batches:
            self.log(f"{self.skipped_batches} batch(es) skipped for a non-finite loss")
        reason = self.stop_reason or "num_epoch"
        summary: dict[str, Any] = {
            "best_epoch": self.best_epoch,
            "best_val_loss": self.best_loss,
            "epochs_run": len(self.history),
            "stopped_early": reason != "num_epoch",
            "stop_reason": reason,
            "skipped_batches": self.skipped_batches,
            "train_batches": self.train_batches,
            "train_time_s": self.train_time_s(),
            "kept_weights": self.best_kind,
            "history": self.history,
            "test": None,
        }
        for cb in self.callbacks:
            summary.update(cb.summary())
        return summary

    def _test(self, test_loader, summary: dict[str, Any]) -> None:
        """The best model's test losses and errors per head, into ``summary``."""
        loss, heads, trues, preds, extras = evaluate_losses(self.strategy, test_loader, collect=True)
        trues, preds, natoms = gather_rows(self.strategy, trues, preds, extras.get("natoms"))
        summary["test"] = {
            "loss": loss,
            "heads": heads,
            "mae": mae_report(trues, preds, natoms, head_units(self.module)),
        }
        summary["test_targets"], summary["test_predictions"], summary["test_natoms"] = trues, preds, natoms
        self.log(f"test loss {loss:.6g}; errors per head (energies per atom, vectors per component):")
        for line in format_errors(summary["test"]["mae"]):
            self.log(line)
