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
from typing import Any, cast

import torch

from hydragnn.data import write_dataset
from hydragnn.data.io.atomic import atomic_write
from hydragnn.data.loaders import create_dataloaders
from hydragnn.models import ModelConfig, build_model, save_artifact
from hydragnn.models.encoders import get_encoder
from hydragnn.models.execution import get_profile
from hydragnn.models.metrics import format_errors, jsonable

from .callbacks import Callback
from .checkpoint import load_checkpoint
from .committee_size import choose_members, stored_members, time_train_step
from .config import RunConfig, load_config, with_members
from .data import load_run_data
from .energy_check import composition_baseline, energy_warnings, force_warnings, zero_force_baseline
from .errors import CheckpointError, TrainError
from .evaluate import evaluate_losses, gather_rows, head_units, mae_report
from .finetune import initialise_from, load_base
from .fit import config_callbacks, fit
from .loop import CHECKPOINT_NAME
from .output_scaling import fill_output_scaling
from .plots import parity_plots
from .progress import LOG_NAME, Progress, run_log
from .references import resolve_reference_energies, resolve_scale_shift
from .run_folder import check_fingerprint, fingerprint, prepare_run_folder
from .strategies import build_optimizer_factory, make_strategy
from .strategies.base import Strategy

__all__ = ["build_scheduler", "fill_data_statistics", "run_training"]


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


# ----------------------------------------------------------------------------- training pieces
def build_scheduler(
    cfg: RunConfig, optimizer: torch.optim.Optimizer
) -> torch.optim.lr_scheduler.ReduceLROnPlateau | torch.optim.lr_scheduler.CosineAnnealingLR | None:
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
    callbacks: Sequence[Callback] = (),
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
        callbacks: the user's training-loop callbacks (:mod:`hydragnn.train.callbacks`), run
            after the built-in ones and those of ``Training.callbacks``.

    Returns:
        The metrics dict also written to ``metrics.json``, with ``paths`` (artifact, config,
        log, metrics, plots, tensorboard).
    """
    t_start = time.perf_counter()
    cfg = load_config(config, init_from=init_from) if not isinstance(config, RunConfig) else config
    profile = get_profile(cfg.training.execution)
    cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, execution=profile.name))  # recorded
    level = cfg.verbosity if verbosity is None else verbosity
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / cfg.dataset.name
    strategy = make_strategy(cfg.training)  # may initialise the process group (before the loaders)
    progress = Progress(level, strategy.is_main)
    lock = None
    try:
        lock = prepare_run_folder(run_dir, resume=resume, overwrite=overwrite, modify=strategy.is_main)
        strategy.barrier()
        with run_log(run_dir, level, is_main=strategy.is_main, append=resume):
            if lock is not None and lock.taken_over is not None:
                progress.log(1, f"{run_dir}: {lock.taken_over}")
            if (notice := profile.configure_process()) is not None:
                progress.log(1, notice)
            progress.log(1, _device_line(strategy.device, cfg.training.device))
            run = _Run(cfg, run_dir, strategy, progress, level)
            return run.execute(resume, callbacks, t_start)
    finally:
        if lock is not None:
            lock.release()
        strategy.teardown()


def _device_line(device: torch.device, request: str) -> str:
    """The run log's line on where the model trains (``Training.device``)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"device: {device} ({name}; Training.device {request!r})"


class _Run:
    """:func:`run_training` once the run folder is ready and its log open: data, model, training,
    then the run folder's files (rank 0)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, strategy: Strategy, progress: Progress, level: int) -> None:
        self.cfg, self.run_dir, self.strategy, self.progress, self.level = cfg, run_dir, strategy, progress, level
        self.log = lambda line: progress.log(1, line)

    def execute(self, resume: bool, callbacks: Sequence[Callback], t_start: float) -> dict[str, Any]:
        cfg, tr = self.cfg, self.cfg.training
        callbacks = [*config_callbacks(tr), *callbacks]  # before the data: the config alone decides their errors
        tr = dataclasses.replace(tr, callbacks=())
        data = self._data()
        loaders = create_dataloaders(data.train, data.val, data.test, tr.batch_size, batching=tr.batching, seed=tr.seed)
        model, facts = self._model(data, loaders, resume)
        cfg = self.cfg  # with an "auto" committee resolved: what the fingerprint and config.json hold
        meaning = fingerprint(cfg.to_dict(), data.files)
        if resume:
            check_fingerprint(_stored_fingerprint(self.run_dir / CHECKPOINT_NAME), meaning, str(self.run_dir))
        self.strategy.max_grad_norm = tr.clip_grad_norm
        self.strategy.setup(model, build_optimizer_factory(tr.optimizer, get_profile(tr.execution).optimizer_step))
        if self.strategy.is_main:
            cfg.save(self.run_dir / "config.json")
        scheduler = build_scheduler(cfg, cast(torch.optim.Optimizer, self.strategy.optimizer))  # built by setup()
        writer = _writer(self.run_dir, self.strategy.is_main, self.progress)
        try:
            summary = fit(
                tr, self.strategy, scheduler, *loaders, log_name=cfg.dataset.name, verbosity=self.level,
                writer=writer, run_dir=self.run_dir, resume=resume, fingerprint=meaning, callbacks=callbacks,
            )  # fmt: skip
        finally:
            if writer is not None:
                writer.close()
        facts["composition_baseline_energy_mae"] = self._energy_warnings(data, facts.pop("model_config"), summary)
        metrics = self._metrics(data, summary, facts)
        paths: dict[str, Any] = {}
        if self.strategy.is_main:
            paths = self._write(data, summary, metrics, facts, tensorboard=writer is not None)
            metrics["wall_s"] = time.perf_counter() - t_start
            metrics["paths"] = paths
            self._write_metrics(metrics)
            paths["metrics"] = str(self.run_dir / "metrics.json")
            for name, errors in (metrics["test_by_head"] or {}).items():
                self.log(f"test errors of the structures of energy head {name!r}:")
                for line in format_errors(errors):
                    self.log(line)
            self.log(f"artifact {paths['artifact']}")
        self.strategy.barrier()
        metrics["paths"] = paths
        return metrics

    def _data(self):
        """The prepared splits (the config completed with the inferred schema)."""
        t0 = time.perf_counter()
        cfg, strategy = self.cfg, self.strategy
        data = load_run_data(cfg, is_main=strategy.is_main, barrier=strategy.barrier, log=self.log)
        if cfg.schema is None:
            self.cfg = cfg = dataclasses.replace(cfg, schema=data.schema)
        self.log(
            f"data set {cfg.dataset.name!r}: {len(data.train)} train, {len(data.val or ())} val, "
            f"{len(data.test or ())} test samples ready in {time.perf_counter() - t0:.1f} s"
        )
        if cfg.mlip_defaults:
            self.log(
                "interatomic-potential defaults for what the config leaves out (hydragnn.train.mlip_defaults): "
                + ", ".join(cfg.mlip_defaults)
            )
        return data

    def _model(self, data, loaders, resume: bool) -> tuple[torch.nn.Module, dict[str, Any]]:
        """The model of the config with the statistics of the training data (and the fine-tuning
        base's weights); facts about it for the metrics and the artifact. An ``"auto"`` committee
        is resolved here, and ``self.cfg`` replaced by the config with its member count."""
        cfg, tr = self.cfg, self.cfg.training
        base = load_base(tr.init_from, cfg.schema, tr.fine_tune, data.species) if tr.init_from is not None else None
        model_config = fill_data_statistics(cfg.model_config, data.train)
        model_config = fill_output_scaling(model_config, cfg.schema, data.train, tr.normalize_outputs)
        model_config, references = resolve_reference_energies(cfg, model_config, data, self.log)
        model_config, scale_shift = resolve_scale_shift(cfg, model_config, data, self.log)
        if cfg.auto_committee:
            members = self._committee_size(model_config, data, loaders, resume)
            self.cfg = cfg = cfg.with_committee(members)
            model_config = with_members(model_config, members)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(tr.seed)
            model = build_model(model_config, cfg.schema)
        fine_tuned = None
        if base is not None:
            fine_tuned = initialise_from(model, base, tr.fine_tune, self.log)
            fine_tuned["artifact"] = tr.init_from
            del base
        if data.heads:
            model.head_weights = torch.tensor(data.head_weights, dtype=torch.float64)
            self.log(f"energy heads (loss weights): {dict(zip(data.heads, data.head_weights, strict=True))}")
        n_params = sum(p.numel() for p in model.parameters())
        self.log(f"model {cfg.model_config.mpnn_type}: {n_params} parameters, precision {cfg.model_config.precision}")
        facts = {
            "model_config": model_config,
            "num_parameters": n_params,
            "reference_energies": references,
            "energy_scale_shift": scale_shift,
            "init_from": fine_tuned,
        }
        return model, facts

    def _committee_size(self, model_config: ModelConfig, data, loaders, resume: bool) -> int:
        """``Architecture.committee: "auto"``: the run folder's count when resuming, else the count
        the time budget buys (:mod:`.committee_size`), from timed steps of a throwaway member;
        under torch.distributed the ranks agree on the mean step time."""
        tr = self.cfg.training
        if resume:
            try:
                members = stored_members(self.run_dir)
            except ValueError as exc:
                raise TrainError(str(exc)) from None
            self.log(f"committee auto: {members} member(s), as the run being resumed chose")
            return members
        step_s = None
        if tr.max_time_s is not None and loaders[0] is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(tr.seed)
                probe = build_model(model_config, self.cfg.schema)
            probe_loader = create_dataloaders(
                data.train, None, None, tr.batch_size, batching=tr.batching, seed=tr.seed
            )[0]
            assert probe_loader is not None  # data.train is not None: the run's loader exists
            profile = get_profile(tr.execution)
            profile.switch_in(probe)  # timed as the run will train
            factory = build_optimizer_factory(tr.optimizer, profile.optimizer_step)
            step = time_train_step(probe, probe_loader, factory, self.strategy.device)
            step_s = float(
                self.strategy.all_reduce_mean(
                    torch.tensor([step], dtype=torch.float64, device=self.strategy.device)
                ).item()
            )
            del probe
        val_batches = len(loaders[1]) if loaders[1] is not None else 0
        train_batches = len(loaders[0]) if loaders[0] is not None else 0
        choice = choose_members(step_s, train_batches, val_batches, tr.max_time_s, tr.num_epoch)
        self.log(f"committee auto: {choice.reason}")
        return choice.members

    def _energy_warnings(self, data, model_config: ModelConfig, summary: dict[str, Any]) -> float | None:
        """Warn when the energy error sat at the composition baseline, or the force error near
        that of zero forces; returns the energy baseline."""
        if not model_config.mlip.enabled or data.heads:
            return None
        name = model_config.mlip.energy_name
        baseline = composition_baseline(data.train, data.val, name)
        lines = energy_warnings(
            summary["history"], summary["best_epoch"], summary["second_stage_epoch"], baseline, name
        )
        forces = model_config.mlip.forces_name
        if forces is not None:
            lines += force_warnings(
                summary["history"], summary["best_epoch"], zero_force_baseline(data.val, forces), forces
            )
        for line in lines:
            self.log(f"warning: {line}")
        return baseline

    def _metrics(self, data, summary: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
        """``metrics.json``'s content (without ``wall_s`` and ``paths``)."""
        tr = self.cfg.training
        by_head = _test_by_head(self.strategy, data, tr.batch_size) if data.heads and data.test is not None else None
        keys = ("best_epoch", "best_val_loss", "epochs_run", "stopped_early", "stop_reason", "second_stage_epoch")
        return {
            "dataset": self.cfg.dataset.name,
            **{k: summary[k] for k in keys},
            "skipped_batches": summary["skipped_batches"],
            "train_time_s": summary["train_time_s"],
            "test": summary["test"],
            "test_by_head": by_head,
            "history": summary["history"],
            "num_parameters": facts["num_parameters"],
            "world_size": self.strategy.world_size,
            "reference_energies": facts["reference_energies"],
            "energy_scale_shift": facts["energy_scale_shift"],
            "composition_baseline_energy_mae": facts["composition_baseline_energy_mae"],
            "energy_heads": dict(zip(data.heads, data.head_weights, strict=True)) or None,
            "init_from": facts["init_from"],
            "data_files": data.files,
        }

    def _write(self, data, summary: dict[str, Any], metrics: dict[str, Any], facts, tensorboard: bool) -> dict:
        """The artifact, the test split and the parity plots (rank 0); returns their paths."""
        cfg, run_dir = self.cfg, self.run_dir
        extra = {
            "best_epoch": summary["best_epoch"],
            "best_val_loss": jsonable(summary["best_val_loss"]),
            "dataset": cfg.dataset.name,
            "config": cfg.to_dict(),
            "execution": summary["execution"],
            **{k: facts[k] for k in ("reference_energies", "energy_scale_shift", "init_from")},
        }
        plain = self.strategy.unwrap()
        paths: dict[str, Any] = {
            "artifact": str(save_artifact(plain, run_dir / "model.hydra", species=data.species, extra=extra)),
            "config": str(run_dir / "config.json"),
            "log": str(run_dir / LOG_NAME),
            "tensorboard": str(run_dir / "tensorboard") if tensorboard else None,
        }
        if data.test is not None:
            paths["test_set"] = str(write_dataset(run_dir / "test_set.pkl", data.test, "pickle", schema=cfg.schema))
        trues, preds = summary.pop("test_targets", None), summary.pop("test_predictions", None)
        natoms = summary.pop("test_natoms", None)
        if trues:
            try:
                plots = parity_plots(trues, preds, run_dir, natoms=natoms, mae=summary["test"]["mae"])
            except OSError as exc:
                raise TrainError(
                    f"{run_dir}: cannot write the parity plots ({exc}); free some space and run again with --resume"
                ) from exc
            paths["plots"] = [str(p) for p in plots]
        return paths

    def _write_metrics(self, metrics: dict[str, Any]) -> None:
        path = self.run_dir / "metrics.json"
        try:
            atomic_write(path, (json.dumps(jsonable(metrics), indent=2) + "\n").encode())
        except OSError as exc:
            raise TrainError(
                f"{path}: cannot be written ({exc}); model.hydra and the training "
                "checkpoint are in place: free some space and run again with --resume to finish"
            ) from exc


def _test_by_head(strategy, data, batch_size: int) -> dict[str, Any]:
    """Test errors of each source's own test structures (``Dataset.sources``), head by head."""
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
