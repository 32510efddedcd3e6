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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydragnn.data import Schema, SchemaError
from hydragnn.data.config_parse import key_values, parse_value
from hydragnn.data.io.atomic import atomic_write
from hydragnn.models import ModelConfig, ModelConfigError
from hydragnn.models.config import COMMON_KEYS as ARCH_COMMON_KEYS

from .config_dataset import DatasetConfig, GeneratorConfig
from .config_sections import (
    CheckpointConfig,
    EarlyStoppingConfig,
    LocalSGDConfig,
    OptimizerConfig,
    ParallelismConfig,
    SchedulerConfig,
    choice,
    section,
)
from .config_training import ARCH, NN, TRAINING, TrainingConfig, parse_training
from .errors import ConfigError
from .finetune import FineTuneConfig
from .mlip_defaults import with_mlip_defaults

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
        auto_committee: ``Architecture.committee`` is ``"auto"``: the pipeline chooses the member
            count from the time budget (:mod:`.committee_size`) and replaces it by the count;
            until then ``model_config.committee`` is 1.
        mlip_defaults: the JSON paths an interatomic potential's config left out and
            :mod:`.mlip_defaults` filled in (empty otherwise; not compared: the completed
            config read back has nothing left out).
    """

    verbosity: int
    dataset: DatasetConfig
    schema: Schema | None
    architecture: dict[str, Any]
    model_config: ModelConfig
    training: TrainingConfig
    reference_energies: str = "auto"
    mlip_defaults: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def auto_committee(self) -> bool:
        return self.architecture.get("committee") == "auto"

    def with_committee(self, members: int) -> RunConfig:
        """This config with ``Architecture.committee`` resolved to ``members``."""
        arch = {**self.architecture, "committee": members}
        mc = with_members(self.model_config, members)
        return dataclasses.replace(self, architecture=arch, model_config=mc)

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


def with_members(config: ModelConfig, members: int) -> ModelConfig:
    """``config`` with ``committee`` set to ``members`` (in ``raw`` too: an artifact's manifest is
    built from it)."""
    return dataclasses.replace(config, committee=members, raw={**config.raw, "committee": members})


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
    if parsed.get("committee") == "auto":  # resolved by the pipeline (hydragnn.train.committee_size)
        parsed["committee"] = 1
    try:
        mc = ModelConfig.from_dict(parsed)
    except ModelConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if mode in REFERENCE_MODES and not mc.mlip.enabled:
        raise ConfigError(
            f"{ARCH}.reference_energies: {mode!r} is for interatomic potentials (enable_interatomic_potential)"
        )
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


def _dataset(dataset: DatasetConfig, mc: ModelConfig) -> DatasetConfig:
    """``Dataset`` completed by the model: its cutoff (and each source's) from the model radius;
    sources only for an interatomic potential whose energy heads, if named, are the sources."""
    if dataset.cutoff is None:
        dataset = dataclasses.replace(dataset, cutoff=mc.radius)
    if not dataset.sources:
        return dataset
    filled = tuple(
        s if s.cutoff is not None else dataclasses.replace(s, cutoff=dataset.cutoff) for s in dataset.sources
    )
    dataset = dataclasses.replace(dataset, sources=filled)
    if not mc.mlip.enabled:
        raise ConfigError(
            "Dataset.sources: one energy head per source is for interatomic potentials (enable_interatomic_potential)"
        )
    names = [s.name for s in dataset.sources]
    heads = [h.name for h in mc.mlip.energy_heads] if mc.mlip.energy_heads else None
    if heads is not None and heads != names:
        raise ConfigError(f"{ARCH}.energy_heads: {heads} must be the Dataset.sources names in order, {names}")
    return dataset


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
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    top = section(source, "config", {"Verbosity", "Dataset", "Variables", NN})
    for key in ("Dataset", NN):
        if key not in top:
            raise ConfigError(
                f"{key}: required section missing"
                + (
                    " (a 'path' or 'train_file' of structures, a 'generator', or the 'name' of a published data set)"
                    if key == "Dataset"
                    else ""
                )
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
        if not schema.has_outputs:
            raise ConfigError(
                "Variables.outputs: a training run needs at least one output to train on; none is declared "
                "(a schema without outputs only prepares samples for prediction)"
            )
    nn = section(top[NN], NN, {"Architecture", "Training"})

    def parse(values: Any) -> TrainingConfig:
        training = parse_training(values)
        if init_from is not None:
            training = dataclasses.replace(training, init_from=str(Path(init_from).resolve()))
        elif training.init_from is not None:
            training = dataclasses.replace(training, init_from=str((base or Path.cwd()) / training.init_from))
        return training

    training = parse(nn.get("Training"))
    if training.fine_tune != FineTuneConfig() and training.init_from is None:
        raise ConfigError(f"{TRAINING}.FineTune: only with {TRAINING}.init_from (the artifact to fine-tune)")
    arch_section = nn.get("Architecture")
    if arch_section is None:
        if training.init_from is None:
            raise ConfigError(f"{ARCH}: required section missing (it may be left out only with Training.init_from)")
        arch_section = _artifact_architecture(training.init_from)
    elif training.init_from is not None and isinstance(arch_section, Mapping) and "committee" not in arch_section:
        # fine-tuning keeps the artifact's members (one each) unless the section says otherwise
        arch_section = {**arch_section, "committee": _artifact_architecture(training.init_from).get("committee", 1)}
    mlip_filled: list[str] = []
    if isinstance(arch_section, Mapping):
        arch_section, training_values, mlip_filled = with_mlip_defaults(arch_section, nn.get("Training"))
        if mlip_filled:
            training = parse(training_values)
    arch, mc, mode = _architecture(arch_section, training, from_artifact="Architecture" not in nn)
    dataset = _dataset(DatasetConfig.from_dict(top["Dataset"], base=base), mc)
    return RunConfig(
        verbosity=level,
        dataset=dataset,
        schema=schema,
        architecture=arch,
        model_config=mc,
        training=training,
        reference_energies=mode,
        mlip_defaults=tuple(mlip_filled),
    )
