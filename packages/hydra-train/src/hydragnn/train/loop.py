"""The training loop: ``train_validate_test`` (the seed API).

Per epoch: the second stage when due (constant learning rate, new MLIP loss weights; the
best model is then chosen among second-stage epochs), ``set_epoch`` on the training loader, one
pass of training steps through the strategy (warmup-scaled learning rate, gradient clipping, EMA
update after each step; a non-finite loss stops with :class:`TrainingAborted` naming the epoch
and batch, or skips the batch under ``nan_policy: "skip"``), validation losses and errors per
head in physical units (averaged across ranks; with the EMA weights when ``EMA`` is on), the
scheduler step (``ReduceLROnPlateau`` on the validation loss; none in the second stage), the best
model by validation loss (kept in memory and in the checkpoint), early stopping, the time budget
(``max_time_s``: stop at the boundary where one more epoch would overrun it), TensorBoard scalars
and an atomic checkpoint every ``Checkpoint.every`` epochs after ``Checkpoint.warmup``.
``resume=True`` continues from the checkpoint in ``run_dir`` and ends with the same parameters as
an uninterrupted run; ``max_time_s`` bounds the whole run, resumed segments included (the
checkpoint keeps the training time used, ``train_time_s``), so a resume whose budget is spent
trains no further epoch. At the end the best state is restored and reported.

Performer attention: the loop counts training batches (:class:`ProjectionRedraw`, outside the
model's forward, so activation checkpointing, which repeats a forward, never double-counts) and
redraws every performer projection right before the forward of batch ``count`` whenever
``count > 0`` and ``count % Training.global_attn_redraw_interval == 0``, from
``(Training.seed, count // interval)``: every rank draws the same projection. Evaluation never
redraws. The count is kept in the checkpoint, so a resumed run redraws where the uninterrupted
one would have.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hydragnn.data.loaders import set_epoch
from hydragnn.models.metrics import format_errors

from .averaging import WeightAverage
from .checkpoint import atomic_save, get_rng_state, load_checkpoint, set_rng_state
from .config import TrainingConfig, parse_training
from .epoch import train_epoch as _train_epoch  # a module global: profilers and harnesses wrap it
from .errors import CheckpointError, TrainingAborted
from .evaluate import evaluate_losses, gather_rows, head_units, mae_report
from .progress import Progress, fmt_errors, fmt_losses
from .run_folder import check_fingerprint
from .schedule import ProjectionRedraw, SecondStage, TimeBudget, Warmup
from .strategies.base import Strategy
from .strategies.optim import adopt_fast_step
from .threads import ThreadTuner

__all__ = ["CHECKPOINT_NAME", "ProjectionRedraw", "train_validate_test"]

CHECKPOINT_NAME = "checkpoint.pt"


def _training_config(nn_config: Any) -> TrainingConfig:
    """``config["NeuralNetwork"]`` (dict), a ``Training`` dict, a TrainingConfig or a RunConfig."""
    if isinstance(nn_config, TrainingConfig):
        return nn_config
    training = getattr(nn_config, "training", None)
    if isinstance(training, TrainingConfig):
        return training
    if isinstance(nn_config, Mapping) and "Training" in nn_config:
        return parse_training(nn_config["Training"])
    return parse_training(nn_config)


def _lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def _scheduler_step(scheduler: Any, val_loss: float) -> None:
    if scheduler is None:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(val_loss)
    else:
        scheduler.step()


def _adopt(strategy: Strategy | None, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Strategy:
    """A set-up strategy: the single-process one adopting ``optimizer`` when none is given (with
    the fused / foreach step when its user left that choice to torch: :func:`adopt_fast_step`)."""
    if strategy is None:
        strategy = Strategy()
    if strategy.optimizer is None:
        if optimizer is None:
            raise TrainingAborted("train_validate_test: give an optimizer or a strategy that is set up")
        adopt_fast_step(optimizer)
        strategy.setup(model, lambda _params: optimizer)
    return strategy


def _clone_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def train_validate_test(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    train_loader,
    val_loader,
    test_loader,
    writer,
    scheduler,
    nn_config: Any,
    log_name: str,
    verbosity: int = 2,
    *,
    strategy: Strategy | None = None,
    run_dir: str | os.PathLike | None = None,
    resume: bool = False,
    fingerprint: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train with validation, keep the best model by validation loss, then test it.

    Args:
        model: the :class:`~hydragnn.models.HydraModel`.
        optimizer: its optimizer (adopted by the single-process strategy; one whose ``foreach``
            and ``fused`` were left unset runs torch's fused or foreach step, see
            :func:`~hydragnn.train.strategies.optim.adopt_fast_step`), or ``None`` when
            ``strategy`` is already set up.
        train_loader, val_loader, test_loader: loaders from ``create_dataloaders``
            (``val_loader`` may be ``None``: the training loss then selects the best epoch;
            ``test_loader`` may be ``None``).
        writer: a TensorBoard ``SummaryWriter`` or ``None``.
        scheduler: an LR scheduler on ``optimizer`` or ``None``.
        nn_config: ``config["NeuralNetwork"]`` (its ``Training`` section is read), or a
            ``TrainingConfig``.
        log_name: run name; the default run folder is ``./logs/<log_name>``.
        verbosity: 0 to 4 (see :mod:`hydragnn.train.progress`).
        strategy: a (set-up or not) strategy; default the single-process one.
        run_dir: where checkpoints go (default ``./logs/<log_name>``).
        resume: continue from ``<run_dir>/checkpoint.pt``.
        fingerprint: what the checkpoint means (``{JSON path: value}``, see
            :func:`hydragnn.train.run_folder.fingerprint`): stored in every checkpoint, and on
            ``resume`` compared with the stored one (a difference is a ``CheckpointError``).

    Returns:
        ``{"best_epoch", "best_val_loss", "epochs_run", "stopped_early", "stop_reason",
        "second_stage_epoch", "skipped_batches", "train_batches", "projection_redraws",
        "train_time_s", "history": [per-epoch dicts], "test": {"loss", "heads", "mae"}}``
        (``stop_reason``: ``"num_epoch"``, ``"early_stopping"`` or ``"max_time_s"``;
        ``train_batches`` and ``train_time_s``: training batches and seconds of training loop
        over the whole run, resumed segments included; ``projection_redraws``:
        performer redraws in this call; ``test.mae``: per head ``mae``, ``rmse``, ``unit``).

    Raises:
        TrainingAborted: a non-finite loss under ``nan_policy: "error"``.
        CheckpointError: ``resume`` without a readable checkpoint that fits the model.
    """
    cfg = _training_config(nn_config)
    if strategy is not None and strategy.optimizer is None and cfg.clip_grad_norm is not None:
        strategy.max_grad_norm = cfg.clip_grad_norm  # before setup: DeepSpeed reads it there
    strategy = _adopt(strategy, model, optimizer)
    if cfg.compile:
        strategy.compile()
    if strategy.max_grad_norm is None:
        strategy.max_grad_norm = cfg.clip_grad_norm
    optimizer = strategy.optimizer
    module = strategy.unwrap()
    progress = Progress(verbosity, strategy.is_main)
    run_dir = Path(run_dir) if run_dir is not None else Path("logs") / log_name
    ckpt_path = run_dir / CHECKPOINT_NAME

    history: list[dict[str, Any]] = []
    best_loss, best_epoch, best_state = math.inf, -1, None
    start_epoch, since_best, skipped_total, batches_total = 0, 0, 0, 0
    redraw = ProjectionRedraw(module, cfg.global_attn_redraw_interval, cfg.seed)
    warmup = Warmup(optimizer, cfg.scheduler.warmup_steps)
    average = WeightAverage(module, cfg.ema.decay) if cfg.ema.enabled else None
    stage = SecondStage(cfg.second_stage, cfg.num_epoch, cfg.max_time_s)
    second_stage_epoch: int | None = None
    used_s = 0.0  # training time of the run's earlier segments
    if resume:
        ckpt = load_checkpoint(ckpt_path)
        if not isinstance(ckpt, dict) or "model" not in ckpt or "epoch" not in ckpt:
            raise CheckpointError(f"{ckpt_path}: not a training checkpoint (no 'model' / 'epoch')")
        if fingerprint is not None:
            check_fingerprint(ckpt.get("fingerprint"), fingerprint, str(ckpt_path))
        try:
            strategy.load_model_state_dict(ckpt["model"])
            if ckpt.get("optimizer") is not None:
                strategy.load_optimizer_state_dict(ckpt["optimizer"])
            if scheduler is not None and ckpt.get("scheduler") is not None:
                scheduler.load_state_dict(ckpt["scheduler"])
            if average is not None:
                average.load_state_dict(ckpt["ema"])
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{ckpt_path}: does not fit this model / optimizer: {exc}") from exc
        start_epoch = int(ckpt["epoch"]) + 1
        best_loss, best_epoch = float(ckpt["best_val_loss"]), int(ckpt["best_epoch"])
        best_state = ckpt["best_state"]
        since_best = int(ckpt["since_best"])
        skipped_total = int(ckpt["skipped_batches"])
        batches_total = int(ckpt.get("seen_batches", 0))
        history = list(ckpt["history"])
        redraw.batches = int(ckpt.get("train_batches", 0))
        warmup.done = int(ckpt.get("warmup_done", 0))
        second_stage_epoch = ckpt.get("second_stage_epoch")
        if second_stage_epoch is not None:
            stage.started = True
            stage.reweigh(module)
        set_rng_state(ckpt["rng"])
        # a checkpoint written before train_time_s was stored: the epochs' own seconds
        used_s = float(ckpt.get("train_time_s", sum(h.get("seconds", 0.0) for h in history)))
        left = "" if cfg.max_time_s is None else f"; {max(cfg.max_time_s - used_s, 0.0):.1f} s of max_time_s left"
        progress.log(1, f"resumed from {ckpt_path} after epoch {start_epoch - 1} ({used_s:.1f} s trained{left})")

    threads = ThreadTuner(
        cfg.intra_op_threads,
        measure=strategy.device.type == "cpu" and not strategy.distributed and not cfg.compile,
        log=lambda line: progress.log(1, line),
    )
    strategy.begin_training()
    try:
        units = head_units(module)
        budget = TimeBudget(cfg.max_time_s, used_s)
        progress.log(1, f"training {log_name}: {cfg.num_epoch} epochs, {len(train_loader)} batches per epoch per rank")
        stop_reason, end_epoch = "num_epoch", cfg.num_epoch
        if resume and history and start_epoch < end_epoch:
            elapsed, out_of_time = budget.check(history[-1].get("seconds", 0.0), strategy)
            if out_of_time:
                stop_reason, end_epoch = "max_time_s", start_epoch
                progress.log(
                    1,
                    f"time budget spent: {elapsed:.1f} s of max_time_s={cfg.max_time_s:g} s used, too little left for another "
                    f"epoch (the last took {history[-1].get('seconds', 0.0):.1f} s), so none is trained; raise "
                    "NeuralNetwork.Training.max_time_s to train more",
                )
        for epoch in range(start_epoch, end_epoch):
            t0 = time.perf_counter()
            elapsed, _ = budget.check(0.0, strategy)
            if stage.due(epoch, elapsed):
                changed = stage.apply(optimizer, module)
                stage.started, second_stage_epoch = True, epoch
                best_loss, since_best = math.inf, 0
                progress.log(
                    1,
                    f"second stage from epoch {epoch}: learning rate {_lr(optimizer):.3g} (constant), loss weights "
                    f"{changed or 'unchanged'}; the best model is now chosen among second-stage epochs",
                )
            set_epoch(train_loader, epoch)
            train_loss, train_heads, skipped, gps = _train_epoch(
                strategy, train_loader, epoch, cfg.nan_policy, progress, redraw, warmup, average, threads
            )
            skipped_total += skipped
            batches_total += len(train_loader)
            if skipped_total > cfg.max_skipped_fraction * batches_total:
                raise TrainingAborted(
                    f"{skipped_total} of {batches_total} training batches so far had a non-finite loss and were skipped "
                    f"(more than max_skipped_fraction={cfg.max_skipped_fraction:g}) at epoch {epoch}: the model is "
                    "diverging; lower the learning rate, clip gradients (clip_grad_norm) or check the data. No artifact "
                    "was written"
                )
            averaged = average.applied(module) if average is not None else contextlib.nullcontext()
            with averaged:
                if val_loader is not None:
                    val_loss, val_heads, _, _, val_extras = evaluate_losses(strategy, val_loader)
                    val_errors = val_extras["errors"]
                else:
                    val_loss, val_heads, val_errors = train_loss, train_heads, None
                improved = val_loss < best_loss
                if improved:
                    best_loss, best_epoch, since_best = val_loss, epoch, 0
                    best_state = _clone_state(strategy.model_state_dict())
                else:
                    since_best += 1
            lr = _lr(optimizer)
            if not stage.started:
                _scheduler_step(scheduler, val_loss)
            record = {
                "epoch": epoch,
                "train_loss": train_loss,
                "val_loss": val_loss,
                "train_heads": train_heads,
                "val_heads": val_heads,
                "val_errors": val_errors,
                "lr": lr,
                "second_stage": stage.started,
                "skipped_batches": skipped,
                "graphs_per_s": gps,
                "seconds": time.perf_counter() - t0,
            }
            history.append(record)
            if writer is not None and strategy.is_main:
                writer.add_scalar("loss/train", train_loss, epoch)
                writer.add_scalar("loss/val", val_loss, epoch)
                writer.add_scalar("lr", lr, epoch)
                for name in train_heads:
                    writer.add_scalar(f"train/{name}", train_heads[name], epoch)
                    writer.add_scalar(f"val/{name}", val_heads[name], epoch)
                for name, err in (val_errors or {}).items():
                    writer.add_scalar(f"val_mae/{name}", err["mae"], epoch)
                    writer.add_scalar(f"val_rmse/{name}", err["rmse"], epoch)
                writer.flush()
            progress.log(
                2,
                f"epoch {epoch}: loss train {train_loss:.4g} val {val_loss:.4g}"
                + (f" | val MAE {fmt_errors(val_errors)}" if val_errors else f" ({fmt_losses(train_heads)})")
                + f" | lr {lr:.3g} | {gps:.1f} graphs/s | {record['seconds']:.1f} s{' *' if improved else ''}",
            )
            stop = cfg.early_stopping.enabled and since_best >= cfg.early_stopping.patience
            if stop:
                stop_reason = "early_stopping"
            elif epoch + 1 < cfg.num_epoch:
                elapsed, out_of_time = budget.check(record["seconds"], strategy)
                if out_of_time:
                    stop, stop_reason = True, "max_time_s"
            ck = cfg.checkpoint
            if (
                ck.enabled
                and (epoch + 1 >= ck.warmup)
                and ((epoch + 1) % ck.every == 0 or stop or epoch + 1 == cfg.num_epoch)
            ):
                state = {
                    "model": _clone_state(strategy.model_state_dict()),
                    "optimizer": strategy.optimizer_state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "epoch": epoch,
                    "best_val_loss": best_loss,
                    "best_epoch": best_epoch,
                    "best_state": best_state,
                    "since_best": since_best,
                    "skipped_batches": skipped_total,
                    "seen_batches": batches_total,
                    "train_batches": redraw.batches,
                    "warmup_done": warmup.done,
                    "second_stage_epoch": second_stage_epoch,
                    "history": history,
                    "train_time_s": budget.elapsed,
                    "rng": get_rng_state(),
                    "fingerprint": dict(fingerprint) if fingerprint is not None else None,
                }
                if average is not None:
                    state["ema"] = average.state_dict()
                if strategy.is_main:
                    atomic_save(state, ckpt_path)
                strategy.barrier()
            if stop:
                if stop_reason == "early_stopping":
                    progress.log(1, f"early stopping after epoch {epoch}: no better validation loss for {since_best} epochs")
                else:
                    progress.log(
                        1,
                        f"time budget max_time_s={cfg.max_time_s:g} s: stopping after epoch {epoch} ({elapsed:.1f} s "
                        f"used, the last epoch took {record['seconds']:.1f} s); the best model is kept",
                    )
                break

        if best_epoch < 0 and history:
            raise TrainingAborted(
                f"no epoch of {len(history)} reached a finite validation loss (last: {history[-1]['val_loss']}); "
                f"{skipped_total} batch(es) were skipped for a non-finite loss. No artifact was written"
            )
        if best_state is not None:
            strategy.load_model_state_dict(best_state)
            what = "EMA weights" if average is not None else "weights"
            progress.log(1, f"best epoch {best_epoch} (val loss {best_loss:.6g}); its {what} are restored")
        if skipped_total:
            progress.log(1, f"{skipped_total} batch(es) skipped for a non-finite loss")
        summary: dict[str, Any] = {
            "best_epoch": best_epoch,
            "best_val_loss": best_loss,
            "epochs_run": len(history),
            "stopped_early": stop_reason != "num_epoch",
            "stop_reason": stop_reason,
            "second_stage_epoch": second_stage_epoch,
            "skipped_batches": skipped_total,
            "train_batches": redraw.batches,
            "projection_redraws": redraw.redraws,
            "train_time_s": budget.elapsed,
            "history": history,
            "test": None,
        }
        if test_loader is not None:
            loss, heads, trues, preds, extras = evaluate_losses(strategy, test_loader, collect=True)
            trues, preds, natoms = gather_rows(strategy, trues, preds, extras.get("natoms"))
            summary["test"] = {"loss": loss, "heads": heads, "mae": mae_report(trues, preds, natoms, units)}
            summary["test_targets"], summary["test_predictions"], summary["test_natoms"] = trues, preds, natoms
            progress.log(1, f"test loss {loss:.6g}; errors per head (energies per atom, vectors per component):")
            for line in format_errors(summary["test"]["mae"]):
                progress.log(1, line)
        return summary
    finally:
        strategy.end_training()
        threads.restore()
