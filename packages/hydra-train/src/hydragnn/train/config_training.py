"""The ``NeuralNetwork.Training`` section of the run config: :class:`TrainingConfig` and
:func:`parse_training` (its subsections live in :mod:`.config_sections`; the whole config in
:mod:`.config`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from hydragnn.data import BatchingConfig, DataError
from hydragnn.data.config_parse import parse_fields, section_keys

from .callbacks import check_callback_specs
from .config_sections import (
    CheckpointConfig,
    EarlyStoppingConfig,
    EMAConfig,
    LocalSGDConfig,
    OptimizerConfig,
    ParallelismConfig,
    SchedulerConfig,
    SecondStageConfig,
    check_parallelism,
    full_replica_strategies,
    legacy_bool_section,
    plain,
    section,
)
from .errors import ConfigError
from .finetune import FineTuneConfig

__all__ = ["ARCH", "MODEL_KEYS_IN_TRAINING", "NN", "TRAINING", "TrainingConfig", "parse_training"]

NN = "NeuralNetwork"
TRAINING = f"{NN}.Training"
ARCH = f"{NN}.Architecture"
MODEL_KEYS_IN_TRAINING = (
    "loss_function_type",
    "compute_grad_energy",
    "precision",
    "conv_checkpointing",
    "energy_loss",
    "energy_weight",
    "forces_weight",
    "stress_weight",
)
"""Keys that belong to the model but may be given under ``Training``; copied into ``Architecture``."""


@dataclass(frozen=True)
class TrainingConfig:
    """A validated ``NeuralNetwork.Training`` section (JSON keys of the same name).

    Attributes:
        num_epoch [10], batch_size [32], seed [0] (model initialisation and shuffling),
        Batching [null] (``hydragnn.data`` cost-aware batching section),
        optimizer, scheduler, early_stopping, checkpoint, parallelism, local_sgd,
        nan_policy ["error" | "skip"]: a non-finite loss stops training, or skips the batch.
        max_skipped_fraction [0.1]: under ``nan_policy: "skip"``, training stops with an error
            (and writes no artifact) once more than this fraction of the training batches so far
            were skipped; a run with no finite validation loss fails the same way.
        max_time_s [null]: wall-clock budget of the training loop over the whole run, resumed
            segments included (the checkpoint keeps the time used); it stops at the epoch boundary
            where the next epoch would overrun it, keeps the best model and says so.
        clip_grad_norm [null]: clip the gradients' global 2-norm to this before each step.
        ema: :class:`EMAConfig` (``EMA``); second_stage: :class:`SecondStageConfig` (``SecondStage``).
        init_from [null]: a model artifact to start from (fine-tuning; relative to the config
            file); fine_tune: :class:`~hydragnn.train.finetune.FineTuneConfig` (``FineTune``).
        global_attn_redraw_interval [1000]: redraw the random projections of performer attention
            (``Architecture.global_attn_type: "performer"``) every this many training batches,
            right before the forward of the batch; null keeps the first projection. No effect on
            other models.
        compile [false]: train through ``torch.compile`` with dynamic shapes (one compiled graph
            for batches of any size, one for evaluation; the first batch waits for the
            compiler): :meth:`~hydragnn.train.strategies.Strategy.compile`, single-process
            only. An interatomic potential takes its forces and stress by ``torch.func.grad``
            then, so forward, forces and the loss's backward compile as one step.
        execution [null | profile name]: how the run computes, never what: the execution profile
            (:mod:`hydragnn.models.execution`: ``"reference"``, stock PyTorch; ``"cpu"``, the
            measured speed devices). Null: :data:`~hydragnn.models.execution.DEFAULT_PROFILE`.
            Recorded in the run log, ``config.json`` and the artifact; free to change on resume.
        intra_op_threads [null | "auto" | int >= 1]: torch's intra-op threads during the run; "auto"
            times the first steps at torch's count and at its halvings and keeps the fastest
            (single-process eager CPU training; otherwise the count stays), see
            :mod:`hydragnn.train.threads`; null: as the execution profile says ("auto" under
            ``"cpu"``, the process's count under ``"reference"``). The process's count is
            restored afterwards.
        device ["auto" | "cpu" | "cuda" | "cuda:N"]: where the model trains. "auto" takes the
            current CUDA device when torch sees one (a distributed rank: its ``LOCAL_RANK``'s GPU),
            else the CPU; "cuda" and "cuda:N" fail with a ConfigError where that GPU is missing; a
            distributed run takes "auto", "cuda" (each rank its local GPU) or "cpu" (gloo only).
            Not part of the run's fingerprint: a run may resume on another device.
        normalize_outputs [null | "minmax" | "standard"]: train every head but an interatomic
            potential's energy, forces and stress on targets normalised by the training split's
            minimum and range (upstream HydraGNN's LSMS normalisation) or mean and standard
            deviation; the model predicts in the data's units (``Architecture.output_scaling``,
            :mod:`hydragnn.train.output_scaling`).
        callbacks [[]]: the user's callbacks, ``[{"name": <registered name>, ...keyword
            arguments}]`` (:mod:`hydragnn.train.callbacks`), run after the built-in ones.
        model_keys: ``loss_function_type`` etc. given here (already copied into Architecture).
    """

    num_epoch: int = field(default=10, metadata={"min": 1})
    batch_size: int = field(default=32, metadata={"min": 1})
    seed: int = field(default=0, metadata={"min": 0})
    batching: dict[str, Any] | None = field(default=None, metadata={"json": "Batching"})
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig, metadata={"json": "Optimizer"})
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata={"json": "Scheduler"})
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig, metadata={"json": "EarlyStopping"})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={"json": "Checkpoint"})
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig, metadata={"json": "Parallelism"})
    local_sgd: LocalSGDConfig = field(default_factory=LocalSGDConfig, metadata={"json": "LocalSGD"})
    nan_policy: Literal["error", "skip"] = "error"
    max_skipped_fraction: float = field(default=0.1, metadata={"min": 0, "max": 1, "noun": "a fraction"})
    max_time_s: float | None = field(default=None, metadata={"gt": 0})
    clip_grad_norm: float | None = field(default=None, metadata={"gt": 0})
    ema: EMAConfig = field(default_factory=EMAConfig, metadata={"json": "EMA"})
    second_stage: SecondStageConfig = field(default_factory=SecondStageConfig, metadata={"json": "SecondStage"})
    init_from: str | None = None
    fine_tune: FineTuneConfig = field(default_factory=FineTuneConfig, metadata={"json": "FineTune"})
    global_attn_redraw_interval: int | None = field(default=1000, metadata={"min": 1})
    compile: bool = False
    execution: str | None = None
    intra_op_threads: int | Literal["auto"] | None = field(default=None, metadata={"min": 1})
    device: str = "auto"
    normalize_outputs: Literal["minmax", "standard"] | None = None
    callbacks: tuple[dict[str, Any], ...] = ()
    model_keys: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The completed ``Training`` section (JSON)."""
        out: dict[str, Any] = {
            "num_epoch": self.num_epoch,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "Batching": copy.deepcopy(self.batching),
            "Optimizer": {k: v for k, v in plain(self.optimizer).items() if v is not None},
            "Scheduler": self.scheduler.to_dict(),
            "EarlyStopping": plain(self.early_stopping),
            "Checkpoint": plain(self.checkpoint),
            "Parallelism": {
                k: v
                for k, v in plain(self.parallelism).items()
                if k != "zero_stage" or k in self.parallelism.spec.options
            },
            "LocalSGD": plain(self.local_sgd),
            "nan_policy": self.nan_policy,
            "max_skipped_fraction": self.max_skipped_fraction,
            "max_time_s": self.max_time_s,
            "clip_grad_norm": self.clip_grad_norm,
            "EMA": plain(self.ema),
            "SecondStage": plain(self.second_stage),
            "init_from": self.init_from,
            "FineTune": plain(self.fine_tune),
            "global_attn_redraw_interval": self.global_attn_redraw_interval,
            "compile": self.compile,
            "execution": self.execution,
            "intra_op_threads": self.intra_op_threads,
            "device": self.device,
            "callbacks": copy.deepcopy(list(self.callbacks)),
        }
        if self.normalize_outputs is not None:  # (absent by default: runs made before it resume)
            out["normalize_outputs"] = self.normalize_outputs
        out.update(dict(self.model_keys))
        return out


_SECTIONS = frozenset(
    {"Batching", "Optimizer", "Scheduler", "EarlyStopping", "Checkpoint", "Parallelism", "LocalSGD", "EMA"}
    | {"SecondStage", "FineTune", "model_keys", "callbacks"}
)
"""Training keys parsed by their own ``from_dict`` (rules between their keys); the rest by annotation."""
_TRAINING_KEYS = (section_keys(TrainingConfig) - {"model_keys"}) | {
    "patience",
    "checkpoint_warmup",
    *MODEL_KEYS_IN_TRAINING,
}


def parse_training(values: Any, where: str = TRAINING) -> TrainingConfig:
    """Parse a ``Training`` section (see :class:`TrainingConfig`).

    Raises:
        ConfigError: naming ``NeuralNetwork.Training.<path>``.
    """
    if isinstance(values, TrainingConfig):
        return values
    v = section(values, where, _TRAINING_KEYS)
    if v.get("max_skipped_fraction", 0) is None:  # null: the default
        del v["max_skipped_fraction"]
    kw = parse_fields(TrainingConfig, v, where, ConfigError, skip=_SECTIONS)
    if v.get("Batching") is not None:
        try:
            BatchingConfig.from_dict(
                {"seed": kw.get("seed", 0), **section(v["Batching"], f"{where}.Batching", _BATCHING_KEYS)}
            )
        except DataError as exc:
            raise ConfigError(
                f"{NN}.{exc}" if str(exc).startswith("Training.") else f"{where}.Batching: {exc}"
            ) from exc
        kw["batching"] = copy.deepcopy(dict(v["Batching"]))
    num_epoch = kw.get("num_epoch", TrainingConfig.num_epoch)
    kw["optimizer"] = OptimizerConfig.from_dict(v.get("Optimizer"), f"{where}.Optimizer")
    kw["scheduler"] = SchedulerConfig.from_dict(v.get("Scheduler"), f"{where}.Scheduler", num_epoch)
    kw["early_stopping"] = legacy_bool_section(v, EarlyStoppingConfig, "EarlyStopping", "patience", "patience", where)
    kw["checkpoint"] = legacy_bool_section(v, CheckpointConfig, "Checkpoint", "checkpoint_warmup", "warmup", where)
    par = kw["parallelism"] = ParallelismConfig.from_dict(v.get("Parallelism"), f"{where}.Parallelism")
    kw["local_sgd"] = LocalSGDConfig.from_dict(v.get("LocalSGD"), f"{where}.LocalSGD")
    check_parallelism(par, kw["local_sgd"], kw["optimizer"], where)
    kw["ema"] = EMAConfig.from_dict(v.get("EMA"), f"{where}.EMA")
    if kw["ema"].enabled and par.spec.shards_parameters:
        raise ConfigError(
            f"{where}.EMA.enabled: the weight average needs the full parameters on every rank; "
            f"strategy {par.strategy!r} shards them (use {', '.join(full_replica_strategies())})"
        )
    kw["second_stage"] = SecondStageConfig.from_dict(v.get("SecondStage"), f"{where}.SecondStage")
    kw["fine_tune"] = FineTuneConfig.from_dict(v.get("FineTune"), f"{where}.FineTune")
    device = kw.get("device", TrainingConfig.device)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ConfigError(f"{where}.device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if kw.get("execution") is not None:
        from hydragnn.models.execution.profiles import ExecutionError, get_profile  # (no torch)

        try:
            get_profile(kw["execution"])
        except ExecutionError as exc:
            raise ConfigError(f"{where}.execution: {exc}") from None
    kw["callbacks"] = check_callback_specs(copy.deepcopy(v.get("callbacks")), f"{where}.callbacks")
    kw["model_keys"] = tuple((k, v[k]) for k in MODEL_KEYS_IN_TRAINING if k in v)
    return TrainingConfig(**kw)


_BATCHING_KEYS = {"mode", "max_nodes", "max_edges", "max_graphs", "oversized_sample", "seed", "drop_last"}
