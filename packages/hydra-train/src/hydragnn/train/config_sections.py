"""Typed, validated sections of the JSON config (helpers of :mod:`hydragnn.train.config`).

Every parser takes the JSON value and its JSON path, fills defaults, and raises
:class:`~hydragnn.train.errors.ConfigError` naming the path and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

_KINDS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
}


def typed(value: Any, kind: str, where: str, *, optional: bool = False) -> Any:
    """Check a scalar JSON value (``int``, ``float``, ``bool`` or ``str``; ints pass as floats)."""
    if value is None and optional:
        return None
    if not _KINDS[kind](value) or (kind == "float" and not math.isfinite(value)):
        found = "null" if value is None else f"{type(value).__name__} {value!r}"
        expected = "a finite float" if isinstance(value, float) and kind == "float" else kind
        raise ConfigError(f"{where}: expected {expected}{' or null' if optional else ''}, found {found}")
    return float(value) if kind == "float" else value


def section(values: Any, where: str, allowed: set[str] | frozenset[str]) -> dict[str, Any]:
    """A JSON object with only ``allowed`` keys (``None`` is an empty object)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected an object, found {type(values).__name__}")
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        paths = ", ".join(f"{where}.{k}" for k in unknown)
        raise ConfigError(f"{paths}: unknown key; allowed: {sorted(allowed)}")
    return dict(values)


def choice(value: Any, options, where: str) -> str:
    value = typed(value, "str", where)
    if value not in options:
        raise ConfigError(f"{where}: expected one of {sorted(options)}, found {value!r}")
    return value


def at_least(value: float | int | None, low: float, where: str, *, strict: bool = False) -> None:
    if value is not None and (value < low or (strict and value == low)):
        raise ConfigError(f"{where}: expected a value {'>' if strict else '>='} {low}, found {value!r}")


def plain(obj: Any) -> Any:
    """A frozen dataclass (nested) as JSON-ready dicts and lists."""
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    return obj


# ------------------------------------------------------------------------- Optimizer
OPTIMIZERS = ("AdamW", "Adam", "SGD", "RMSprop", "Adagrad")


@dataclass(frozen=True)
class OptimizerConfig:
    """``Training.Optimizer``: type [AdamW], learning_rate [1e-3], weight_decay [0],
    momentum [0; SGD / RMSprop only], use_zero_redundancy [false; ddp only]."""

    type: str = "AdamW"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    momentum: float | None = None
    use_zero_redundancy: bool = False

    @classmethod
    def from_dict(cls, values: Any, where: str) -> OptimizerConfig:
        v = section(values, where, {f.name for f in dataclasses.fields(cls)})
        kw: dict[str, Any] = {}
        if "type" in v:
            kw["type"] = choice(v["type"], OPTIMIZERS, f"{where}.type")
        if "learning_rate" in v:
            kw["learning_rate"] = typed(v["learning_rate"], "float", f"{where}.learning_rate")
            at_least(kw["learning_rate"], 0.0, f"{where}.learning_rate", strict=True)
        if "weight_decay" in v:
            kw["weight_decay"] = typed(v["weight_decay"], "float", f"{where}.weight_decay")
            at_least(kw["weight_decay"], 0.0, f"{where}.weight_decay")
        if "momentum" in v:
            kw["momentum"] = typed(v["momentum"], "float", f"{where}.momentum", optional=True)
            at_least(kw["momentum"], 0.0, f"{where}.momentum")
            if kw["momentum"] is not None and kw.get("type", cls.type) not in ("SGD", "RMSprop"):
                raise ConfigError(f"{where}.momentum: only SGD and RMSprop take a momentum, type is {kw.get('type', cls.type)!r}")
        if "use_zero_redundancy" in v:
            kw["use_zero_redundancy"] = typed(v["use_zero_redundancy"], "bool", f"{where}.use_zero_redundancy")
        return cls(**kw)


# ------------------------------------------------------------------------- Scheduler
SCHEDULERS = ("ReduceLROnPlateau", "CosineAnnealingLR", "none")
_SCHED_KEYS = {
    "ReduceLROnPlateau": {"factor": 0.5, "patience": 5, "min_lr": 0.0, "threshold": 1e-4},
    "CosineAnnealingLR": {"T_max": None, "eta_min": 0.0},
    "none": {},
}


@dataclass(frozen=True)
class SchedulerConfig:
    """``Training.Scheduler``: type [ReduceLROnPlateau] and its keys.

    ReduceLROnPlateau (stepped on the validation loss): factor [0.5], patience [5],
    min_lr [0], threshold [1e-4]. CosineAnnealingLR: T_max [num_epoch], eta_min [0].
    Every type: warmup_steps [0], the first training batches run at a learning rate rising
    linearly to the scheduled one (``lr * (k + 1) / warmup_steps`` at batch ``k``).
    """

    type: str = "ReduceLROnPlateau"
    options: tuple[tuple[str, Any], ...] = ()
    warmup_steps: int = 0

    @classmethod
    def from_dict(cls, values: Any, where: str, num_epoch: int) -> SchedulerConfig:
        if isinstance(values, Mapping) and "type" in values:
            kind = choice(values["type"], SCHEDULERS, f"{where}.type")
        else:
            kind = cls.type
        defaults = dict(_SCHED_KEYS[kind])
        v = section(values, where, {"type", "warmup_steps", *defaults})
        warmup = typed(v.get("warmup_steps", 0), "int", f"{where}.warmup_steps")
        at_least(warmup, 0, f"{where}.warmup_steps")
        opts: dict[str, Any] = {}
        for key, default in defaults.items():
            value = v.get(key, default)
            if key == "T_max":
                value = num_epoch if value is None else typed(value, "int", f"{where}.T_max")
                at_least(value, 1, f"{where}.T_max")
            elif key == "patience":
                value = typed(value, "int", f"{where}.{key}")
                at_least(value, 0, f"{where}.{key}")
            else:
                value = typed(value, "float", f"{where}.{key}")
                at_least(value, 0.0, f"{where}.{key}")
            opts[key] = value
        if kind == "ReduceLROnPlateau" and not 0.0 < opts["factor"] < 1.0:
            raise ConfigError(f"{where}.factor: expected a value in (0, 1), found {opts['factor']!r}")
        return cls(type=kind, options=tuple(opts.items()), warmup_steps=warmup)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dict(self.options), "warmup_steps": self.warmup_steps}


# ------------------------------------------------------------------------- EarlyStopping / Checkpoint
@dataclass(frozen=True)
class EarlyStoppingConfig:
    """``Training.EarlyStopping``: enabled [false], patience [10] epochs without a better val loss.
    Also accepted: ``"EarlyStopping": true`` with a top-level ``"patience"`` (HydraGNN 3 style)."""

    enabled: bool = False
    patience: int = 10


@dataclass(frozen=True)
class CheckpointConfig:
    """``Training.Checkpoint``: enabled [true], warmup [0] epochs before the first checkpoint,
    every [1] epochs. Also accepted: ``"Checkpoint": bool`` with ``"checkpoint_warmup"``."""

    enabled: bool = True
    warmup: int = 0
    every: int = 1


def legacy_bool_section(
    values: Mapping[str, Any], key: str, alias: str, alias_field: str, where: str
) -> dict[str, Any]:
    """``EarlyStopping``/``Checkpoint`` as an object, or a bool plus a top-level alias key."""
    sec = values.get(key)
    if isinstance(sec, bool):
        sec = {"enabled": sec}
    sec = dict(section(sec, f"{where}.{key}", {"enabled", alias_field, "warmup", "every", "patience"}))
    if alias in values:
        if alias_field in sec and sec[alias_field] != values[alias]:
            raise ConfigError(
                f"{where}.{alias}: conflicts with {where}.{key}.{alias_field} "
                f"({values[alias]!r} != {sec[alias_field]!r}); give one of them"
            )
        sec[alias_field] = values[alias]
    return sec


def parse_early_stopping(sec: dict[str, Any], where: str) -> EarlyStoppingConfig:
    section(sec, where, {"enabled", "patience"})
    enabled = typed(sec.get("enabled", EarlyStoppingConfig.enabled), "bool", f"{where}.enabled")
    patience = typed(sec.get("patience", EarlyStoppingConfig.patience), "int", f"{where}.patience")
    at_least(patience, 1, f"{where}.patience")
    return EarlyStoppingConfig(enabled=enabled, patience=patience)


def parse_checkpoint(sec: dict[str, Any], where: str) -> CheckpointConfig:
    section(sec, where, {"enabled", "warmup", "every"})
    enabled = typed(sec.get("enabled", CheckpointConfig.enabled), "bool", f"{where}.enabled")
    warmup = typed(sec.get("warmup", CheckpointConfig.warmup), "int", f"{where}.warmup")
    at_least(warmup, 0, f"{where}.warmup")
    every = typed(sec.get("every", CheckpointConfig.every), "int", f"{where}.every")
    at_least(every, 1, f"{where}.every")
    return CheckpointConfig(enabled=enabled, warmup=warmup, every=every)


# ------------------------------------------------------------------------- Parallelism / LocalSGD
PARALLEL_STRATEGIES = ("none", "ddp", "fsdp", "fsdp2", "deepspeed")


@dataclass(frozen=True)
class ParallelismConfig:
    """``Training.Parallelism``: strategy [none], find_unused_parameters [false; ddp],
    zero_stage [1; deepspeed], timeout_s [300]."""

    strategy: str = "none"
    find_unused_parameters: bool = False
    zero_stage: int = 1
    timeout_s: float = 300.0

    @classmethod
    def from_dict(cls, values: Any, where: str) -> ParallelismConfig:
        v = section(values, where, {f.name for f in dataclasses.fields(cls)})
        kw: dict[str, Any] = {}
        if "strategy" in v:
            kw["strategy"] = choice(v["strategy"], PARALLEL_STRATEGIES, f"{where}.strategy")
        strategy = kw.get("strategy", cls.strategy)
        if "find_unused_parameters" in v:
            kw["find_unused_parameters"] = typed(v["find_unused_parameters"], "bool", f"{where}.find_unused_parameters")
            if kw["find_unused_parameters"] and strategy != "ddp":
                raise ConfigError(f"{where}.find_unused_parameters: only used with strategy 'ddp', strategy is {strategy!r}")
        if "zero_stage" in v:
            kw["zero_stage"] = typed(v["zero_stage"], "int", f"{where}.zero_stage")
            if kw["zero_stage"] not in (1, 2, 3):
                raise ConfigError(f"{where}.zero_stage: expected 1, 2 or 3, found {kw['zero_stage']!r}")
            if strategy != "deepspeed":
                raise ConfigError(f"{where}.zero_stage: only used with strategy 'deepspeed', strategy is {strategy!r}")
        if "timeout_s" in v:
            kw["timeout_s"] = typed(v["timeout_s"], "float", f"{where}.timeout_s")
            at_least(kw["timeout_s"], 0.0, f"{where}.timeout_s", strict=True)
        return cls(**kw)


@dataclass(frozen=True)
class LocalSGDConfig:
    """``Training.LocalSGD``: enabled [false; needs ddp], warmup_steps [0],
    synchronization_period [4], optimizer_state_policy [rank_local | synchronized]."""

    enabled: bool = False
    warmup_steps: int = 0
    synchronization_period: int = 4
    optimizer_state_policy: str = "rank_local"

    @classmethod
    def from_dict(cls, values: Any, where: str) -> LocalSGDConfig:
        v = section(values, where, {f.name for f in dataclasses.fields(cls)})
        kw: dict[str, Any] = {}
        if "enabled" in v:
            kw["enabled"] = typed(v["enabled"], "bool", f"{where}.enabled")
        if "warmup_steps" in v:
            kw["warmup_steps"] = typed(v["warmup_steps"], "int", f"{where}.warmup_steps")
            at_least(kw["warmup_steps"], 0, f"{where}.warmup_steps")
        if "synchronization_period" in v:
            kw["synchronization_period"] = typed(v["synchronization_period"], "int", f"{where}.synchronization_period")
            at_least(kw["synchronization_period"], 1, f"{where}.synchronization_period")
        if "optimizer_state_policy" in v:
            kw["optimizer_state_policy"] = choice(
                v["optimizer_state_policy"], ("rank_local", "synchronized"), f"{where}.optimizer_state_policy"
            )
        return cls(**kw)


# ------------------------------------------------------------------------- EMA / SecondStage
@dataclass(frozen=True)
class EMAConfig:
    """``Training.EMA``: enabled [false], decay [0.99]: an exponential moving average of the
    weights, updated after every optimizer step, is what validation, test and the saved model use."""

    enabled: bool = False
    decay: float = 0.99

    @classmethod
    def from_dict(cls, values: Any, where: str) -> EMAConfig:
        v = section(values, where, {"enabled", "decay"})
        enabled = typed(v.get("enabled", cls.enabled), "bool", f"{where}.enabled")
        decay = typed(v.get("decay", cls.decay), "float", f"{where}.decay")
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"{where}.decay: expected a value in (0, 1), found {decay!r}")
        return cls(enabled=enabled, decay=decay)


@dataclass(frozen=True)
class SecondStageConfig:
    """``Training.SecondStage`` (MACE's "stage two" / SWA switch): enabled [false], start [0.75]
    (fraction of ``num_epoch``, or of ``max_time_s`` when that is reached first), then the
    learning rate becomes learning_rate [kept] and stays constant, and the MLIP loss weights
    energy_weight / forces_weight / stress_weight [kept] replace the first stage's. The best
    model is chosen among second-stage epochs."""

    enabled: bool = False
    start: float = 0.75
    learning_rate: float | None = None
    energy_weight: float | None = None
    forces_weight: float | None = None
    stress_weight: float | None = None

    @classmethod
    def from_dict(cls, values: Any, where: str) -> SecondStageConfig:
        v = section(values, where, {f.name for f in dataclasses.fields(cls)})
        kw: dict[str, Any] = {}
        if "enabled" in v:
            kw["enabled"] = typed(v["enabled"], "bool", f"{where}.enabled")
        if "start" in v:
            kw["start"] = typed(v["start"], "float", f"{where}.start")
            if not 0.0 < kw["start"] < 1.0:
                raise ConfigError(f"{where}.start: expected a fraction in (0, 1), found {kw['start']!r}")
        for key in ("learning_rate", "energy_weight", "forces_weight", "stress_weight"):
            if key in v:
                kw[key] = typed(v[key], "float", f"{where}.{key}", optional=True)
                at_least(kw[key], 0.0, f"{where}.{key}", strict=key == "learning_rate")
        return cls(**kw)

    @property
    def weights(self) -> dict[str, float]:
        """``{role: weight}`` of the weights this stage sets."""
        roles = {"energy": self.energy_weight, "forces": self.forces_weight, "stress": self.stress_weight}
        return {role: w for role, w in roles.items() if w is not None}
