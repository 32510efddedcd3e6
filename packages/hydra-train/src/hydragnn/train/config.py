"""The JSON run config, parsed into typed, validated, frozen objects.

Top level: ``Verbosity``, ``Dataset``, ``Variables``, ``NeuralNetwork`` (``Architecture``,
``Training``). An unknown key, a wrong type or an impossible combination raises
:class:`ConfigError` naming the JSON path (``NeuralNetwork.Training.Optimizer.lr: unknown key;
allowed: [...]``). :meth:`RunConfig.to_dict` gives the completed config (defaults filled), which
:func:`load_config` reads back to an equal config.

Example::

    {"Verbosity": {"level": 2},
     "Dataset": {"name": "cuau", "generator": {"name": "cuau", "n_structures": 200, "seed": 0},
                 "split": [0.8, 0.1, 0.1], "seed": 0},
     "Variables": {"inputs": [...], "outputs": [...]},
     "NeuralNetwork": {"Architecture": {"mpnn_type": "SchNet", ...},
                       "Training": {"num_epoch": 20, "batch_size": 8,
                                    "Optimizer": {"type": "AdamW", "learning_rate": 1e-3}}}}
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hydragnn.data import BatchingConfig, DataError, Schema, SchemaError
from hydragnn.data.atomic import atomic_write
from hydragnn.models import ModelConfig, ModelConfigError
from hydragnn.models.config import COMMON_KEYS as ARCH_COMMON_KEYS
from hydragnn.models.config_parse import key_values, parse_fields, parse_value, section_keys

from .config_dataset import DatasetConfig, GeneratorConfig
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
    choice,
    legacy_bool_section,
    plain,
    section,
)
from .errors import ConfigError
from .finetune import FineTuneConfig

__all__ = [
    "CheckpointConfig",
    "DatasetConfig",
    "EarlyStoppingConfig",
    "GeneratorConfig",
    "LocalSGDConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "RunConfig",
    "SchedulerConfig",
    "TrainingConfig",
    "load_config",
    "parse_training",
]

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


# ------------------------------------------------------------------------- Training
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
        max_time_s [null]: wall-clock budget of the training loop; it stops at the epoch boundary
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
            only, not for interatomic potentials with forces by autograd.
        intra_op_threads ["auto" | int >= 1]: torch's intra-op threads during the run; "auto"
            times the first steps at torch's count and at its halvings and keeps the fastest
            (single-process eager CPU training; otherwise the count stays), see
            :mod:`hydragnn.train.threads`. The process's count is restored afterwards.
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
    intra_op_threads: int | Literal["auto"] = field(default="auto", metadata={"min": 1})
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
                if k != "zero_stage" or self.parallelism.strategy == "deepspeed"
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
            "intra_op_threads": self.intra_op_threads,
        }
        out.update(dict(self.model_keys))
        return out


_SECTIONS = frozenset(
    {"Batching", "Optimizer", "Scheduler", "EarlyStopping", "Checkpoint", "Parallelism", "LocalSGD", "EMA"}
    | {"SecondStage", "FineTune", "model_keys"}
)
"""Training keys parsed by their own ``from_dict`` (rules between their keys); the rest by annotation."""
_TRAINING_KEYS = (section_keys(TrainingConfig) - {"model_keys"}) | {"patience", "checkpoint_warmup", *MODEL_KEYS_IN_TRAINING}


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
    if kw["ema"].enabled and par.strategy in ("fsdp", "fsdp2"):
        raise ConfigError(
            f"{where}.EMA.enabled: the weight average needs the full parameters on every rank; "
            f"strategy {par.strategy!r} shards them (use none, ddp or deepspeed)"
        )
    kw["second_stage"] = SecondStageConfig.from_dict(v.get("SecondStage"), f"{where}.SecondStage")
    kw["fine_tune"] = FineTuneConfig.from_dict(v.get("FineTune"), f"{where}.FineTune")
    kw["model_keys"] = tuple((k, v[k]) for k in MODEL_KEYS_IN_TRAINING if k in v)
    return TrainingConfig(**kw)


_BATCHING_KEYS = {"mode", "max_nodes", "max_edges", "max_graphs", "oversized_sample", "seed", "drop_last"}


# ------------------------------------------------------------------------- RunConfig
REFERENCE_MODES = ("average", "isolated_atoms")
"""``Architecture.reference_energies`` given as a word: fitted from the data by hydra-train."""
FITTED_KEYS = ("energy_shift", "energy_scale")
"""MLIP keys that, left out, are computed from the training data (and stored in the artifact)."""


@dataclass(frozen=True)
class RunConfig:
    """The whole validated config.

    Attributes:
        verbosity: 0 (silent) to 4 (every batch).
        dataset: :class:`DatasetConfig` (cutoff filled from the model radius).
        schema: the ``Variables`` as a :class:`hydragnn.data.Schema`, or ``None`` when the
            section is left out: the schema then comes from the data (inferred from the label
            keys of a file ASE reads, stored with a container, the reference set's for a
            generator) and is filled in by the pipeline.
        architecture: the completed ``Architecture`` dict (Training's model keys copied in,
            common defaults filled); ``model_config`` is its parsed :class:`ModelConfig`.
        training: :class:`TrainingConfig`.
        reference_energies: how the MLIP reference energies are found: ``"given"`` (values in
            the Architecture), ``"average"`` (least squares on the training split),
            ``"isolated_atoms"`` (the data's ``IsolatedAtom`` frames), ``"none"`` (null), or
            ``"auto"`` (not given: isolated atoms when every species has one, else average).
    """

    verbosity: int
    dataset: DatasetConfig
    schema: Schema | None
    architecture: dict[str, Any]
    model_config: ModelConfig
    training: TrainingConfig
    reference_energies: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        """The completed config as JSON (defaults filled); ``load_config`` reads it back."""
        out: dict[str, Any] = {"Verbosity": {"level": self.verbosity}, "Dataset": self.dataset.to_dict()}
        if self.schema is not None:
            out["Variables"] = self.schema.to_dict()
        out[NN] = {"Architecture": copy.deepcopy(self.architecture), "Training": self.training.to_dict()}
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as JSON (atomically)."""
        return atomic_write(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    def nn_config(self) -> dict[str, Any]:
        """The completed ``NeuralNetwork`` section (what ``train_validate_test`` takes)."""
        return self.to_dict()[NN]


def _architecture(
    arch: Any, training: TrainingConfig, from_artifact: bool = False
) -> tuple[dict[str, Any], ModelConfig, str]:
    if not isinstance(arch, Mapping):
        raise ConfigError(f"{ARCH}: expected an object, found {type(arch).__name__}")
    arch = copy.deepcopy(dict(arch))
    for key, value in training.model_keys:
        if key in arch and arch[key] != value and not from_artifact:
            raise ConfigError(
                f"{TRAINING}.{key}: {value!r} conflicts with {ARCH}.{key} = {arch[key]!r}; give it in one place"
            )
        arch[key] = value
    parsed = dict(arch)
    if "reference_energies" not in arch:
        mode = "auto"
    elif isinstance(arch["reference_energies"], str):
        mode = choice(arch["reference_energies"], REFERENCE_MODES, f"{ARCH}.reference_energies")
        del parsed["reference_energies"]
    else:
        mode = "none" if arch["reference_energies"] is None else "given"
    try:
        mc = ModelConfig.from_dict(parsed)
    except ModelConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if mode in REFERENCE_MODES and not mc.mlip.enabled:
        raise ConfigError(f"{ARCH}.reference_energies: {mode!r} is for interatomic potentials (enable_interatomic_potential)")
    parsed_values = key_values(mc)
    for key in sorted(ARCH_COMMON_KEYS):
        if key not in arch and key not in ("task_weights", "reference_energies", "output_heads", *FITTED_KEYS):
            value = parsed_values[key]
            if isinstance(value, (bool, int, float, str)) or value is None:
                arch[key] = value
    return arch, mc, mode


def _artifact_architecture(path: str) -> dict[str, Any]:
    from hydragnn.models import ModelError
    from hydragnn.models.artifact import read_manifest

    try:
        return dict(read_manifest(path)["architecture"])
    except ModelError as exc:
        raise ConfigError(f"{TRAINING}.init_from: {exc}") from None


def load_config(
    source: str | os.PathLike | Mapping[str, Any] | RunConfig, *, init_from: str | os.PathLike | None = None
) -> RunConfig:
    """Parse and validate a run config from a JSON file path or a dict.

    Relative paths in ``Dataset`` and ``Training.init_from`` are resolved against the config
    file's folder (the working folder for a dict). With ``init_from`` (``--init-from``; it
    overrides ``Training.init_from``) or ``Training.init_from`` the ``Architecture`` section may be
    left out: the artifact's is used, with the ``Training`` model keys (loss weights, ...) applied.

    Raises:
        ConfigError: naming the JSON path of the first problem and what was expected.
    """
    if isinstance(source, RunConfig):
        return source
    base = None
    if not isinstance(source, Mapping):
        path = Path(source)
        base = path.resolve().parent
        try:
            source = json.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    top = section(source, "config", {"Verbosity", "Dataset", "Variables", NN})
    for key in ("Dataset", NN):
        if key not in top:
            raise ConfigError(
                f"{key}: required section missing"
                + (" (a 'path' or 'train_file' of structures, or a 'generator')" if key == "Dataset" else "")
            )
    verb = section(top.get("Verbosity"), "Verbosity", {"level"})
    level = parse_value(verb.get("level", 2), int, "Verbosity.level", ConfigError, {"min": 0, "max": 4})
    schema = None
    if top.get("Variables") is not None:
        try:
            schema = Schema.from_dict(top["Variables"])
        except SchemaError as exc:
            msg = str(exc)
            raise ConfigError(msg if msg.startswith("Variables") else f"Variables: {msg}") from exc
    nn = section(top[NN], NN, {"Architecture", "Training"})
    training = parse_training(nn.get("Training"))
    if init_from is not None:
        training = dataclasses.replace(training, init_from=str(Path(init_from).resolve()))
    elif training.init_from is not None:
        training = dataclasses.replace(training, init_from=str((base or Path.cwd()) / training.init_from))
    if training.fine_tune != FineTuneConfig() and training.init_from is None:
        raise ConfigError(f"{TRAINING}.FineTune: only with {TRAINING}.init_from (the artifact to fine-tune)")
    arch_section = nn.get("Architecture")
    if arch_section is None:
        if training.init_from is None:
            raise ConfigError(f"{ARCH}: required section missing (it may be left out only with Training.init_from)")
        arch_section = _artifact_architecture(training.init_from)
    arch, mc, mode = _architecture(arch_section, training, from_artifact="Architecture" not in nn)
    dataset = DatasetConfig.from_dict(top["Dataset"], base=base)
    if dataset.cutoff is None:
        dataset = dataclasses.replace(dataset, cutoff=mc.radius)
    if dataset.sources:
        filled = tuple(s if s.cutoff is not None else dataclasses.replace(s, cutoff=dataset.cutoff) for s in dataset.sources)
        dataset = dataclasses.replace(dataset, sources=filled)
        if not mc.mlip.enabled:
            raise ConfigError("Dataset.sources: one energy head per source is for interatomic potentials (enable_interatomic_potential)")
        names = [s.name for s in dataset.sources]
        heads = [h.name for h in mc.mlip.energy_heads] if mc.mlip.energy_heads else None
        if heads is not None and heads != names:
            raise ConfigError(f"{ARCH}.energy_heads: {heads} must be the Dataset.sources names in order, {names}")
    return RunConfig(
        verbosity=level,
        dataset=dataset,
        schema=schema,
        architecture=arch,
        model_config=mc,
        training=training,
        reference_energies=mode,
    )
