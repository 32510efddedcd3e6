"""``fit``: train a set-up strategy's model under a parsed ``Training`` section (the one main path).

:func:`~hydragnn.train.pipeline.run_training` calls it with the config it parsed once and a
strategy it set up; the seed's :func:`~hydragnn.train.seed_api.train_validate_test` is a shim that
parses its config forms, adopts the user's optimizer and calls it. :func:`fit` applies the
execution profile (``Training.execution`` or the ``execution`` argument;
:mod:`hydragnn.models.execution`: process tuning, the primitive backends and derivative engine
switched into the model for the run and out again after it, the strategy's optimizer step, the
thread policy), compiles where ``Training.compile`` asks, builds the callbacks the section asks for
(:func:`builtin_callbacks`: performer redraws, warmup, the weight average (EMA), intra-op thread
tuning, the second stage, early stopping, the time budget (``max_time_s``), TensorBoard scalars,
the dead-head-unit report;
then the user's, from ``Training.callbacks`` and the ``callbacks`` argument) and runs a
:class:`~hydragnn.train.loop.TrainingLoop`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydragnn.models.execution import Execution, ExecutionError, get_profile

from .averaging import WeightAverage
from .callbacks import Callback, EarlyStopping, TensorBoardScalars, build_callbacks
from .config_training import TRAINING, TrainingConfig
from .errors import ConfigError
from .health import DeadHeadUnits, HeadInputScale
from .loop import CHECKPOINT_NAME, TrainingLoop
from .progress import Progress
from .schedule import ProjectionRedraw, SecondStage, TimeBudget, Warmup
from .strategies.base import Strategy
from .threads import ThreadTuner

__all__ = ["builtin_callbacks", "fit", "run_profile"]


def run_profile(choice: str | Execution | None, cfg: TrainingConfig) -> Execution:
    """The run's execution profile: ``choice``, else ``Training.execution``, else the default.

    Raises:
        ConfigError: an unknown profile, named as ``NeuralNetwork.Training.execution``.
    """
    try:
        return get_profile(choice if choice is not None else cfg.execution)
    except ExecutionError as exc:
        raise ConfigError(f"{TRAINING}.execution: {exc}") from None


def builtin_callbacks(cfg: TrainingConfig, strategy: Strategy, writer: Any, progress: Progress) -> list[Callback]:
    """The callbacks the ``Training`` section asks for, in the order they run."""
    module = strategy.unwrap()
    callbacks: list[Callback] = [ProjectionRedraw(cfg.global_attn_redraw_interval, cfg.seed)]
    if cfg.scheduler.warmup_steps:
        callbacks.append(Warmup(cfg.scheduler.warmup_steps))
    if cfg.ema.enabled:
        callbacks.append(WeightAverage(module, cfg.ema.decay, cfg.ema.warmup))
    threads = cfg.intra_op_threads
    if threads is None and strategy.execution.tunes_threads:
        threads = "auto"
    if threads is not None:
        measure = strategy.device.type == "cpu" and not strategy.distributed and not cfg.compile
        callbacks.append(ThreadTuner(threads, measure=measure, log=lambda line: progress.log(1, line)))
    callbacks.append(SecondStage(cfg.second_stage, cfg.num_epoch, cfg.max_time_s))
    if cfg.early_stopping.enabled:
        callbacks.append(EarlyStopping(cfg.early_stopping.patience))
    if cfg.max_time_s is not None:
        callbacks.append(TimeBudget(cfg.max_time_s, cfg.num_epoch))
    if writer is not None:
        callbacks.append(TensorBoardScalars(writer))
    callbacks.append(DeadHeadUnits())
    callbacks.append(HeadInputScale())
    return callbacks


BUILTIN_KEYS: frozenset[str] = frozenset(
    c.key
    for c in (
        ProjectionRedraw, Warmup, WeightAverage, ThreadTuner, SecondStage, EarlyStopping, TimeBudget,
        TensorBoardScalars, DeadHeadUnits, HeadInputScale,
    )
)  # fmt: skip
"""Checkpoint keys of the built-in callbacks: a callback from the config may not take one."""


def config_callbacks(cfg: TrainingConfig) -> list[Callback]:
    """The callbacks of ``Training.callbacks``, built and checked against the built-in ones'
    checkpoint keys (:data:`BUILTIN_KEYS`) and each other's. ``run_training`` calls it before any
    data loads (the config alone decides these errors); :func:`fit` for the seed API.

    Raises:
        ConfigError: naming ``Training.callbacks[i]`` (see :func:`~.callbacks.build_callbacks`), or a key
            that is taken.
    """
    where = f"{TRAINING}.callbacks"
    built = build_callbacks(cfg.callbacks, where)
    seen: dict[str, int] = {}
    for i, callback in enumerate(built):
        key = callback.name
        if key in BUILTIN_KEYS:
            raise ConfigError(
                f"{where}[{i}]: callback {cfg.callbacks[i]['name']!r} has the checkpoint key {key!r} of a built-in "
                "callback; give its class another `key`"
            )
        if key in seen:
            raise ConfigError(
                f"{where}[{i}]: callback key {key!r} is also that of {where}[{seen[key]}]; give one another `key`"
            )
        seen[key] = i
    return built


def fit(
    cfg: TrainingConfig,
    strategy: Strategy,
    scheduler: Any,
    train_loader: Any,
    val_loader: Any,
    test_loader: Any,
    *,
    log_name: str,
    verbosity: int = 2,
    writer: Any = None,
    run_dir: str | os.PathLike | None = None,
    resume: bool = False,
    fingerprint: Mapping[str, Any] | None = None,
    callbacks: Sequence[Callback] = (),
    execution: str | Execution | None = None,
) -> dict[str, Any]:
    """Train with validation, keep the best model by validation loss, then test it.

    Args:
        cfg: the parsed ``Training`` section.
        strategy: a set-up strategy (model and optimizer; ``max_grad_norm`` as its owner set it).
        scheduler, train_loader, val_loader, test_loader, writer, log_name, verbosity, run_dir,
        resume, fingerprint, callbacks: as :func:`~hydragnn.train.seed_api.train_validate_test`
            documents them.
        execution: the profile (default ``Training.execution``, else the default profile).

    Returns:
        The summary :func:`~hydragnn.train.seed_api.train_validate_test` documents, with
        ``"execution"``: the profile's report for the model.
    """
    profile = run_profile(execution, cfg)
    strategy.execution = profile
    progress = Progress(verbosity, strategy.is_main)
    if (notice := profile.configure_process()) is not None:
        progress.log(3, notice)  # (run_training logs it at level 1, before the data loads)
    module = strategy.unwrap()
    profile.switch_in(module)
    ran = profile.report(module)
    progress.log(1, profile.describe())
    try:
        if cfg.compile:
            strategy.compile()
        run_dir = Path(run_dir) if run_dir is not None else Path("logs") / log_name
        user = config_callbacks(cfg) + list(callbacks)
        every = builtin_callbacks(cfg, strategy, writer, progress) + user
        loop = TrainingLoop(cfg, strategy, scheduler, progress, run_dir / CHECKPOINT_NAME, every, fingerprint)
        if resume:
            loop.resume()
        summary = loop.run(train_loader, val_loader, test_loader, log_name)
    finally:
        profile.switch_out(module)
    summary["execution"] = ran
    return summary
