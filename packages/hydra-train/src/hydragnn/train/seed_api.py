"""``train_validate_test``, the seed API: a model, an optimizer and loaders in, a trained model out.

A shim over :func:`~hydragnn.train.fit.fit`, the one main path: it takes the seed's argument list
and any form of the ``Training`` section (a config's ``NeuralNetwork`` dict, the section itself, a
``TrainingConfig`` or a ``RunConfig``), has the single-process strategy adopt the optimizer when
no strategy is given (its step as the execution profile says), and fits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from hydragnn.models.execution import Execution

from .callbacks import Callback
from .config import TrainingConfig, parse_training
from .errors import TrainingAborted
from .fit import builtin_callbacks, fit, run_profile
from .strategies.base import Strategy
from .strategies.optim import adopt_fast_step

__all__ = ["builtin_callbacks", "train_validate_test"]


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


def _adopt(
    strategy: Strategy | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    execution: Execution,
    clip_grad_norm: float | None,
) -> Strategy:
    """A set-up strategy: the single-process one adopting ``optimizer`` when none is given (with
    the fused / foreach step when its user left that choice to torch and the profile's
    ``optimizer_step`` is not ``"torch"``: :func:`adopt_fast_step`), its ``max_grad_norm`` from
    ``Training.clip_grad_norm`` unless set (before setup: DeepSpeed reads it there)."""
    if strategy is None:
        strategy = Strategy()
    if strategy.max_grad_norm is None:
        strategy.max_grad_norm = clip_grad_norm
    if strategy.optimizer is None:
        if optimizer is None:
            raise TrainingAborted("train_validate_test: give an optimizer or a strategy that is set up")
        if execution.optimizer_step != "torch":
            adopt_fast_step(optimizer)
        strategy.setup(model, lambda _params: optimizer)
    return strategy


def train_validate_test(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    train_loader: Any,
    val_loader: Any,
    test_loader: Any,
    writer: Any,
    scheduler: Any,
    nn_config: Any,
    log_name: str,
    verbosity: int = 2,
    *,
    strategy: Strategy | None = None,
    run_dir: str | os.PathLike | None = None,
    resume: bool = False,
    fingerprint: Mapping[str, Any] | None = None,
    callbacks: Sequence[Callback] = (),
    execution: str | Execution | None = None,
) -> dict[str, Any]:
    """Train with validation, keep the best model by validation loss, then test it.

    Args:
        model: the :class:`~hydragnn.models.HydraModel`.
        optimizer: its optimizer (adopted by the single-process strategy; under a profile whose
            ``optimizer_step`` is not ``"torch"``, one whose ``foreach`` and ``fused`` were left
            unset runs torch's fused or foreach step, see
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
        callbacks: the user's :class:`~hydragnn.train.callbacks.Callback` objects, run after the
            built-in ones and those of ``Training.callbacks``.
        execution: the execution profile (a name or an
            :class:`~hydragnn.models.execution.Execution`); default ``Training.execution``, else
            :data:`~hydragnn.models.execution.DEFAULT_PROFILE`. Its backends and derivative engine
            are switched into the model for the run and out again when it ends.

    Returns:
        ``{"best_epoch", "best_val_loss", "epochs_run", "stopped_early", "stop_reason", "kept_weights",
        "second_stage_epoch", "skipped_batches", "train_batches", "projection_redraws",
        "train_time_s", "history": [per-epoch dicts], "test": {"loss", "heads", "mae"}}``
        and the callbacks' ``summary()`` entries (``stop_reason``: ``"num_epoch"``,
        ``"early_stopping"``, ``"max_time_s"`` or a callback's; ``kept_weights``: ``"weights"``,
        ``"EMA weights"``, or ``"raw weights"`` when the last epoch's live weights validated better
        than the best average (``best_epoch`` / ``best_val_loss`` are then theirs); ``train_batches`` and
        ``train_time_s``: training batches and seconds of training loop over the whole run,
        resumed segments included; ``projection_redraws``: performer redraws in this call;
        ``test.mae``: per head ``mae``, ``rmse``, ``unit``; ``execution``: the profile's
        :meth:`~hydragnn.models.execution.Execution.report` for the model).

    Raises:
        TrainingAborted: a non-finite loss under ``nan_policy: "error"``.
        CheckpointError: ``resume`` without a readable checkpoint that fits the model.
        ConfigError: a ``Training.callbacks`` entry that names no known callback or gives it
            options it does not take.
    """
    cfg = _training_config(nn_config)
    profile = run_profile(execution, cfg)
    strategy = _adopt(strategy, model, optimizer, profile, cfg.clip_grad_norm)
    return fit(
        cfg, strategy, scheduler, train_loader, val_loader, test_loader, log_name=log_name, verbosity=verbosity,
        writer=writer, run_dir=run_dir, resume=resume, fingerprint=fingerprint, callbacks=callbacks,
        execution=profile,
    )  # fmt: skip
