"""The whole pipeline behind ``hydragnn-train``: config -> data -> model -> training -> run folder.

Run folder contents: ``config.json`` (the completed config), ``checkpoint.pt`` (latest training
state), ``model.hydra`` (the artifact of the best epoch), ``metrics.json`` (history, best epoch,
test errors per head in physical units), ``parity_<head>.png``, ``tensorboard/``,
``test_set.pkl`` (the test split, so ``hydragnn-predict`` can reproduce the test errors) and
``train.log`` (what the console showed, with the warnings; a resumed run appends to it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hydragnn.data import create_dataloaders, write_dataset
from hydragnn.data.atomic import atomic_write
from hydragnn.data.threads import configure_threads
from hydragnn.models import ModelConfig, build_model, save_artifact
from hydragnn.models.encoders import get_encoder
from hydragnn.models.encoders.pna import degree_histogram
from hydragnn.models.metrics import format_errors, jsonable, training_label_keys

from .checkpoint import load_checkpoint
from .config import RunConfig, load_config
from .data import cuau_samples, load_run_data, prepare_samples, split_indices
from .energy_check import composition_baseline, energy_warnings
from .errors import CheckpointError, TrainError
from .evaluate import mae_report
from .finetune import initialise_from, load_base
from .loop import CHECKPOINT_NAME, train_validate_test
from .plots import parity_plots
from .progress import LOG_NAME, Progress, run_log
from .references import resolve_reference_energies, resolve_scale_shift
from .run_folder import check_fingerprint, fingerprint, prepare_run_folder
from .strategies import build_optimizer_factory, make_strategy
from .strategies.base import Strategy

__all__ = [
    "build_scheduler",
    "cuau_samples",
    "degree_histogram",
    "fill_data_statistics",
    "fill_degree_histogram",
    "format_errors",
    "prepare_samples",
    "run_training",
    "split_indices",
]


# ----------------------------------------------------------------------------- data
def fill_data_statistics(model_config: ModelConfig, trainset: Sequence) -> ModelConfig:
    """The model config with the encoder's statistics of the training set filled in.

    Asks the encoder class (:meth:`~hydragnn.models.encoders.Encoder.data_statistics`) which
    ``Architecture`` keys it computes from the training data and the config leaves unset (the
    PNA family's in-degree histogram ``pna_deg``), and writes them into the section, so the
    artifact rebuilds the same model. The same on every rank: every rank prepares the whole
    dataset. Returns ``model_config`` itself when there is nothing to fill.
    """
    if model_config.mpnn_type is None:
        return model_config
    updates = get_encoder(model_config.mpnn_type).data_statistics(model_config.encoder, trainset)
    return ModelConfig.from_dict({**model_config.raw, **updates}) if updates else model_config


fill_degree_histogram = fill_data_statistics
"""The name this function had while it filled only ``pna_deg``."""


# ----------------------------------------------------------------------------- training pieces
def build_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer):
    """The LR scheduler of ``Training.Scheduler`` (or ``None``)."""
    sched = cfg.training.scheduler
    opts = dict(sched.options)
    if sched.type == "ReduceLROnPlateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=opts["factor"],
            patience=opts["patience"],
            min_lr=opts["min_lr"],
            threshold=opts["threshold"],
        )
    if sched.type == "CosineAnnealingLR":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=opts["T_max"], eta_min=opts["eta_min"])
    return None


def _writer(run_dir: Path, is_main: bool, progress: Progress):
    if not is_main:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed
        progress.log(1, "tensorboard is not installed: no TensorBoard logs (pip install tensorboard)")
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def run_training(
    config: str | os.PathLike | Mapping[str, Any] | RunConfig,
    run_dir: str | os.PathLike | None = None,
    *,
    resume: bool = False,
    verbosity: int | None = None,
    overwrite: bool = False,
    init_from: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline of a config and fill the run folder.

    Args:
        config: the JSON config (path or dict) or a :class:`RunConfig`.
        run_dir: the run folder (default ``runs/<Dataset.name>``); a folder holding a run is
            reused only with ``resume`` or ``overwrite``.
        resume: continue from ``<run_dir>/checkpoint.pt`` (refused when the config changed what
            the checkpoint means; see :mod:`hydragnn.train.run_folder`).
        verbosity: override of ``Verbosity.level``.
        overwrite: replace the run files of a previous run in ``run_dir``.
        init_from: a model artifact to fine-tune (overrides ``Training.init_from``; see
            :mod:`hydragnn.train.finetune`).

    Returns:
        The metrics dict also written to ``metrics.json``, with ``paths`` (artifact, config,
        log, metrics, plots, tensorboard).
    """
    t_start = time.perf_counter()
    cfg = load_config(config, init_from=init_from) if not isinstance(config, RunConfig) else config
    level = cfg.verbosity if verbosity is None else verbosity
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / cfg.dataset.name
    strategy = make_strategy(cfg.training)  # may initialise the process group (before the loaders)
    progress = Progress(level, strategy.is_main)
    try:
        prepare_run_folder(run_dir, resume=resume, overwrite=overwrite, modify=strategy.is_main)
        strategy.barrier()
        with run_log(run_dir, level, is_main=strategy.is_main, append=resume):
            progress.log(1, configure_threads())
            return _run(cfg, run_dir, strategy, progress, level, resume, t_start)
    finally:
        strategy.teardown()


def _run(
    cfg: RunConfig, run_dir: Path, strategy: Strategy, progress: Progress, level: int, resume: bool, t_start: float
) -> dict[str, Any]:
    """:func:`run_training` once the run folder is ready and its log open."""
    t0 = time.perf_counter()
    data = load_run_data(
        cfg, is_main=strategy.is_main, barrier=strategy.barrier, log=lambda line: progress.log(1, line)
    )
    if cfg.schema is None:
        cfg = dataclasses.replace(cfg, schema=data.schema)
    trainset, valset, testset = data.train, data.val, data.test
    progress.log(
        1,
        f"dataset {cfg.dataset.name}: {len(trainset)} train, {len(valset or ())} val, {len(testset or ())} test "
        f"samples ready in {time.perf_counter() - t0:.1f} s",
    )
    if cfg.mlip_defaults:
        progress.log(
            1,
            "interatomic-potential defaults for what the config leaves out (hydragnn.train.mlip_defaults): "
            + ", ".join(cfg.mlip_defaults),
        )
    meaning = fingerprint(cfg.to_dict(), data.files)
    if resume:
        check_fingerprint(_stored_fingerprint(run_dir / CHECKPOINT_NAME), meaning, str(run_dir))
    tr = cfg.training
    train_loader, val_loader, test_loader = create_dataloaders(
        trainset, valset, testset, tr.batch_size, batching=tr.batching, seed=tr.seed
    )
    base = load_base(tr.init_from, cfg.schema, tr.fine_tune, data.species) if tr.init_from is not None else None
    model_config = fill_data_statistics(cfg.model_config, trainset)
    model_config, references = resolve_reference_energies(cfg, model_config, data, lambda line: progress.log(1, line))
    model_config, scale_shift = resolve_scale_shift(cfg, model_config, data, lambda line: progress.log(1, line))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tr.seed)
        model = build_model(model_config, cfg.schema)
    fine_tuned = None
    if base is not None:
        fine_tuned = initialise_from(model, base, tr.fine_tune, lambda m: progress.log(1, m))
        fine_tuned["artifact"] = tr.init_from
        del base
    if data.heads:
        model.head_weights = torch.tensor(data.head_weights, dtype=torch.float64)
        progress.log(1, f"energy heads (loss weights): {dict(zip(data.heads, data.head_weights, strict=True))}")
    n_params = sum(p.numel() for p in model.parameters())
    progress.log(
        1, f"model {cfg.model_config.mpnn_type}: {n_params} parameters, precision {cfg.model_config.precision}"
    )
    strategy.max_grad_norm = tr.clip_grad_norm
    strategy.setup(model, build_optimizer_factory(tr.optimizer))
    if strategy.is_main:
        cfg.save(run_dir / "config.json")
    scheduler = build_scheduler(cfg, strategy.optimizer)
    writer = _writer(run_dir, strategy.is_main, progress)
    try:
        summary = train_validate_test(
            model,
            strategy.optimizer,
            train_loader,
            val_loader,
            test_loader,
            writer,
            scheduler,
            tr,
            cfg.dataset.name,
            level,
            strategy=strategy,
            run_dir=run_dir,
            resume=resume,
            fingerprint=meaning,
        )
    finally:
        if writer is not None:
            writer.close()
    baseline = None
    if model_config.mlip.enabled and not data.heads:
        baseline = composition_baseline(trainset, valset, model_config.mlip.energy_name)
        warnings = energy_warnings(
            summary["history"], summary["best_epoch"], summary["second_stage_epoch"], baseline, model_config.mlip.energy_name
        )
        for line in warnings:
            progress.log(1, f"warning: {line}")
    by_head = _test_by_head(strategy, data, tr.batch_size) if data.heads and testset is not None else None
    trues = summary.pop("test_targets", None)
    preds = summary.pop("test_predictions", None)
    natoms = summary.pop("test_natoms", None)
    metrics: dict[str, Any] = {
        "dataset": cfg.dataset.name,
        "best_epoch": summary["best_epoch"],
        "best_val_loss": summary["best_val_loss"],
        "epochs_run": summary["epochs_run"],
        "stopped_early": summary["stopped_early"],
        "stop_reason": summary["stop_reason"],
        "second_stage_epoch": summary["second_stage_epoch"],
        "skipped_batches": summary["skipped_batches"],
        "train_time_s": summary["train_time_s"],
        "test": summary["test"],
        "test_by_head": by_head,
        "history": summary["history"],
        "num_parameters": n_params,
        "world_size": strategy.world_size,
        "reference_energies": references,
        "energy_scale_shift": scale_shift,
        "composition_baseline_energy_mae": baseline,
        "energy_heads": dict(zip(data.heads, data.head_weights, strict=True)) or None,
        "init_from": fine_tuned,
        "data_files": data.files,
    }
    paths: dict[str, Any] = {}
    if strategy.is_main:
        plain = strategy.unwrap()
        paths["artifact"] = str(
            save_artifact(
                plain,
                run_dir / "model.hydra",
                species=data.species,
                extra={
                    "best_epoch": summary["best_epoch"],
                    "best_val_loss": jsonable(summary["best_val_loss"]),
                    "dataset": cfg.dataset.name,
                    "config": cfg.to_dict(),
                    "reference_energies": references,
                    "energy_scale_shift": scale_shift,
                    "init_from": fine_tuned,
                },
            )
        )
        paths["config"] = str(run_dir / "config.json")
        paths["log"] = str(run_dir / LOG_NAME)
        paths["tensorboard"] = str(run_dir / "tensorboard") if writer is not None else None
        if testset is not None:
            paths["test_set"] = str(write_dataset(run_dir / "test_set.pkl", testset, "pickle", schema=cfg.schema))
        if trues:
            try:
                plots = parity_plots(trues, preds, run_dir, natoms=natoms, mae=summary["test"]["mae"])
            except OSError as exc:
                raise TrainError(
                    f"{run_dir}: cannot write the parity plots ({exc}); free some space and run again with --resume"
                ) from exc
            paths["plots"] = [str(p) for p in plots]
        metrics["wall_s"] = time.perf_counter() - t_start
        metrics["paths"] = paths
        try:
            atomic_write(run_dir / "metrics.json", (json.dumps(jsonable(metrics), indent=2) + "\n").encode())
        except OSError as exc:
            raise TrainError(
                f"{run_dir / 'metrics.json'}: cannot be written ({exc}); model.hydra and the training "
                "checkpoint are in place: free some space and run again with --resume to finish"
            ) from exc
        paths["metrics"] = str(run_dir / "metrics.json")
        for name, errors in (by_head or {}).items():
            progress.log(1, f"test errors of the structures of energy head {name!r}:")
            for line in format_errors(errors):
                progress.log(1, line)
        progress.log(1, f"artifact {paths['artifact']}")
    strategy.barrier()
    metrics["paths"] = paths
    return metrics


def _test_by_head(strategy, data, batch_size: int) -> dict[str, Any]:
    """Test errors of each source's own test structures (``Dataset.sources``), head by head."""
    from .evaluate import evaluate_losses, gather_rows, head_units

    units = head_units(strategy.unwrap())
    out = {}
    for name, part in zip(data.heads, data.parts, strict=True):
        if not part.test:
            continue
        _, _, loader = create_dataloaders(None, None, part.test, batch_size)
        _, _, trues, preds, extras = evaluate_losses(strategy, loader, collect=True)
        trues, preds, natoms = gather_rows(strategy, trues, preds, extras.get("natoms"))
        out[name] = mae_report(trues, preds, natoms, units)
    return out


def _stored_fingerprint(path: Path) -> dict[str, Any] | None:
    ckpt = load_checkpoint(path)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a training checkpoint (found a {type(ckpt).__name__})")
    return ckpt.get("fingerprint")


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
    from hydragnn.models import load_artifact

    from .data import evaluation_samples
    from .evaluate import _as_strategy, evaluate_losses, head_units

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
