"""Typed sections of ``NeuralNetwork.Training`` (helpers of :mod:`hydragnn.train.config`).

Each section is a frozen dataclass whose fields, annotations and ``metadata`` (ranges, choices)
are its JSON keys and rules; :mod:`hydragnn.data.config_parse` parses it with
:class:`~hydragnn.train.errors.ConfigError` (messages name the JSON path). A section's
``from_dict`` adds only the rules between its keys. :func:`check_parallelism` holds the rules
between sections (strategy, LocalSGD, ZeroRedundancyOptimizer), checked once where the
``Training`` section is parsed and again by ``make_strategy`` for a raw dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from hydragnn.data import config_parse as cp

from .errors import ConfigError


def section(values: Any, where: str, allowed: Iterable[str]) -> dict[str, Any]:
    """A JSON object with only ``allowed`` keys (``None`` is an empty object)."""
    return cp.check_keys(values, where, allowed, ConfigError)


def choice(value: Any, options: Iterable[str], where: str) -> str:
    """A string that must be one of ``options``."""
    return cp.choice(value, options, where, ConfigError)


plain = cp.to_json
"""A frozen dataclass (nested) as JSON-ready dicts and lists."""

_POSITIVE = {"gt": 0}
_NON_NEGATIVE = {"min": 0}


# ------------------------------------------------------------------------- Optimizer
OptimizerType = Literal["AdamW", "Adam", "SGD", "RMSprop", "Adagrad"]
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerType)
WITH_MOMENTUM = ("SGD", "RMSprop")


@dataclass(frozen=True)
class OptimizerConfig:
    """``Training.Optimizer``: type [AdamW], learning_rate [1e-3], weight_decay [0],
    momentum [0; SGD / RMSprop only], use_zero_redundancy [false; ddp only]."""

    type: OptimizerType = "AdamW"
    learning_rate: float = field(default=1e-3, metadata=_POSITIVE)
    weight_decay: float = field(default=0.0, metadata=_NON_NEGATIVE)
    momentum: float | None = field(default=None, metadata=_NON_NEGATIVE)
    use_zero_redundancy: bool = False

    @classmethod
    def from_dict(cls, values: Any, where: str) -> OptimizerConfig:
        out = cp.parse_dataclass(cls, values, where, ConfigError)
        if out.momentum is not None and out.type not in WITH_MOMENTUM:
            raise ConfigError(f"{where}.momentum: only SGD and RMSprop take a momentum, type is {out.type!r}")
        return out


# ------------------------------------------------------------------------- Scheduler
@dataclass(frozen=True)
class _Plateau:
    factor: float = field(default=0.5, metadata={"gt": 0, "lt": 1})
    patience: int = field(default=5, metadata=_NON_NEGATIVE)
    min_lr: float = field(default=0.0, metadata=_NON_NEGATIVE)
    threshold: float = field(default=1e-4, metadata=_NON_NEGATIVE)


@dataclass(frozen=True)
class _Cosine:
    T_max: int | None = field(default=None, metadata={"min": 1})
    eta_min: float = field(default=0.0, metadata=_NON_NEGATIVE)


@dataclass(frozen=True)
class _NoSchedule:
    pass


_SCHEDULES: dict[str, type] = {"ReduceLROnPlateau": _Plateau, "CosineAnnealingLR": _Cosine, "none": _NoSchedule}
SCHEDULERS = tuple(_SCHEDULES)


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
        """The keys allowed depend on ``type``; ``options`` holds the type's keys, defaults filled."""
        kind = cls.type
        if isinstance(values, Mapping) and "type" in values:
            kind = choice(values["type"], SCHEDULERS, f"{where}.type")
        keys = _SCHEDULES[kind]
        v = section(values, where, {"type", "warmup_steps", *cp.section_keys(keys)})
        warmup = cp.parse_value(v.get("warmup_steps", 0), int, f"{where}.warmup_steps", ConfigError, _NON_NEGATIVE)
        opts = plain(keys(**cp.parse_fields(keys, v, where, ConfigError)))
        if "T_max" in opts and opts["T_max"] is None:
            opts["T_max"] = num_epoch
        return cls(type=kind, options=tuple(opts.items()), warmup_steps=warmup)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dict(self.options), "warmup_steps": self.warmup_steps}


# ------------------------------------------------------------------------- EarlyStopping / Checkpoint
@dataclass(frozen=True)
class EarlyStoppingConfig:
    """``Training.EarlyStopping``: enabled [false], patience [10] epochs without a better val loss.
    Also accepted: ``"EarlyStopping": true`` with a top-level ``"patience"`` (HydraGNN 3 style)."""

    enabled: bool = False
    patience: int = field(default=10, metadata={"min": 1})


@dataclass(frozen=True)
class CheckpointConfig:
    """``Training.Checkpoint``: enabled [true], warmup [0] epochs before the first checkpoint,
    every [1] epochs. Also accepted: ``"Checkpoint": bool`` with ``"checkpoint_warmup"``."""

    enabled: bool = True
    warmup: int = field(default=0, metadata=_NON_NEGATIVE)
    every: int = field(default=1, metadata={"min": 1})


def legacy_bool_section(
    values: Mapping[str, Any], cls: type, key: str, alias: str, alias_field: str, where: str
) -> Any:
    """``EarlyStopping`` / ``Checkpoint`` (dataclass ``cls``) from an object, or from a bool
    plus the top-level alias key (``patience``, ``checkpoint_warmup``)."""
    sec = values.get(key)
    if isinstance(sec, bool):
        sec = {"enabled": sec}
    sec = section(sec, f"{where}.{key}", cp.section_keys(cls))
    if alias in values:
        if alias_field in sec and sec[alias_field] != values[alias]:
            raise ConfigError(
                f"{where}.{alias}: conflicts with {where}.{key}.{alias_field} "
                f"({values[alias]!r} != {sec[alias_field]!r}); give one of them"
            )
        sec[alias_field] = values[alias]
    return cp.parse_dataclass(cls, sec, f"{where}.{key}", ConfigError)


# ------------------------------------------------------------------------- Parallelism / LocalSGD
@dataclass(frozen=True)
class StrategySpec:
    """What the config needs to know of a training strategy, without importing it (torch-free).

    Attributes:
        name: the registry name (``Parallelism.strategy``).
        options: the ``Parallelism`` keys of its own (``find_unused_parameters``, ``zero_stage``);
            giving another strategy's option is an error.
        replicates: every rank keeps a full replica updated by a gradient all-reduce (DDP):
            ``LocalSGD`` and ``Optimizer.use_zero_redundancy`` build on it.
        shards_parameters: parameters are sharded across ranks (FSDP): ``EMA`` is refused.
        selectable: ``Parallelism.strategy`` may name it (``localsgd`` is chosen by
            ``LocalSGD.enabled`` instead).
    """

    name: str
    options: tuple[str, ...] = ()
    replicates: bool = False
    shards_parameters: bool = False
    selectable: bool = True


STRATEGY_SPECS: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in (
        StrategySpec("none"),
        StrategySpec("ddp", options=("find_unused_parameters",), replicates=True),
        StrategySpec("fsdp", shards_parameters=True),
        StrategySpec("fsdp2", shards_parameters=True),
        StrategySpec("deepspeed", options=("zero_stage",)),
        StrategySpec("localsgd", selectable=False),
    )
}
"""The strategies a config may name: the built-in ones declared here, so that a config validates
before torch is imported, and any added by ``strategies.register_strategy(spec=...)``, which
also checks that every registered class has its spec."""


def declare_strategy(spec: StrategySpec) -> None:
    """Add ``spec`` to :data:`STRATEGY_SPECS` (the same spec again is a no-op; another is refused)."""
    known = STRATEGY_SPECS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"strategy {spec.name!r} is already declared as {known}")
    STRATEGY_SPECS[spec.name] = spec


def strategy_spec(name: str, where: str) -> StrategySpec:
    """The spec of a selectable strategy; a :class:`ConfigError` at ``where`` lists the known names."""
    spec = STRATEGY_SPECS.get(name) if isinstance(name, str) else None
    if spec is None or not spec.selectable:
        names = ", ".join(repr(n) for n, s in STRATEGY_SPECS.items() if s.selectable)
        raise ConfigError(f"{where}: expected one of {names}, found {name!r}")
    return spec


def full_replica_strategies() -> list[str]:
    """The selectable strategies that keep the full parameters on every rank."""
    return [n for n, s in STRATEGY_SPECS.items() if s.selectable and not s.shards_parameters]


@dataclass(frozen=True)
class ParallelismConfig:
    """``Training.Parallelism``: strategy [none] (a name of :data:`STRATEGY_SPECS`),
    find_unused_parameters [false; ddp], zero_stage [1; deepspeed], timeout_s [300]."""

    strategy: str = "none"
    find_unused_parameters: bool = False
    zero_stage: Literal[1, 2, 3] = 1
    timeout_s: float = field(default=300.0, metadata=_POSITIVE)

    @property
    def spec(self) -> StrategySpec:
        return STRATEGY_SPECS[self.strategy]

    @classmethod
    def from_dict(cls, values: Any, where: str) -> ParallelismConfig:
        out = cp.parse_dataclass(cls, values, where, ConfigError)
        spec = strategy_spec(out.strategy, f"{where}.strategy")
        given = {"find_unused_parameters": out.find_unused_parameters, "zero_stage": "zero_stage" in (values or {})}
        for option, used in given.items():
            if used and option not in spec.options:
                owner = next((s.name for s in STRATEGY_SPECS.values() if option in s.options), "another strategy")
                raise ConfigError(f"{where}.{option}: only used with strategy {owner!r}, strategy is {out.strategy!r}")
        return out


@dataclass(frozen=True)
class LocalSGDConfig:
    """``Training.LocalSGD``: enabled [false; needs ddp], warmup_steps [0],
    synchronization_period [4], optimizer_state_policy [rank_local | synchronized]."""

    enabled: bool = False
    warmup_steps: int = field(default=0, metadata=_NON_NEGATIVE)
    synchronization_period: int = field(default=4, metadata={"min": 1})
    optimizer_state_policy: Literal["rank_local", "synchronized"] = "rank_local"

    @classmethod
    def from_dict(cls, values: Any, where: str) -> LocalSGDConfig:
        return cp.parse_dataclass(cls, values, where, ConfigError)


def check_parallelism(par: ParallelismConfig, lsgd: LocalSGDConfig, optimizer: OptimizerConfig, where: str) -> None:
    """The rules between ``Parallelism``, ``LocalSGD`` and ``Optimizer`` (``where``: the
    ``Training`` path): LocalSGD and ZeroRedundancyOptimizer need a replicating strategy
    (``ddp``), and not together."""
    replicating = ", ".join(repr(s.name) for s in STRATEGY_SPECS.values() if s.replicates)
    if lsgd.enabled and not par.spec.replicates:
        raise ConfigError(
            f"{where}.LocalSGD.enabled: LocalSGD needs {where}.Parallelism.strategy {replicating}, found {par.strategy!r}"
        )
    if optimizer.use_zero_redundancy and not par.spec.replicates:
        raise ConfigError(
            f"{where}.Optimizer.use_zero_redundancy: needs {where}.Parallelism.strategy {replicating}, found {par.strategy!r}"
        )
    if lsgd.enabled and optimizer.use_zero_redundancy:
        raise ConfigError(
            f"{where}.LocalSGD.enabled: not with Optimizer.use_zero_redundancy (sharded state cannot be averaged)"
        )


# ------------------------------------------------------------------------- EMA / SecondStage
@dataclass(frozen=True)
class EMAConfig:
    """``Training.EMA``: enabled [false], decay [0.99], warmup [true]: an exponential moving
    average of the weights, updated after every optimizer step, is what validation, test and the
    saved model use. With ``warmup`` the decay after ``n`` updates is ``min(decay, (1 + n) / (10 +
    n))`` (torch-ema's and timm's rule), so the average of a short run follows its weights instead
    of holding on to the initial ones (at 0.99 without it, 56 steps still keep 57 % of them)."""

    enabled: bool = False
    decay: float = field(default=0.99, metadata={"gt": 0, "lt": 1})
    warmup: bool = True

    @classmethod
    def from_dict(cls, values: Any, where: str) -> EMAConfig:
        return cp.parse_dataclass(cls, values, where, ConfigError)


@dataclass(frozen=True)
class SecondStageConfig:
    """``Training.SecondStage`` (MACE's "stage two" / SWA switch): enabled [false], start [0.75]
    (fraction of ``num_epoch``, or of ``max_time_s`` when that is reached first), then the
    learning rate becomes learning_rate [kept] and stays constant, and the MLIP loss weights
    change: energy_factor / forces_factor / stress_factor [1] multiply the first stage's weights
    (the user's weights stay in proportion), energy_weight / forces_weight / stress_weight
    [kept] replace them (one of the two per role). The best model is chosen among second-stage
    epochs."""

    enabled: bool = False
    start: float = field(default=0.75, metadata={"gt": 0, "lt": 1, "noun": "a fraction"})
    learning_rate: float | None = field(default=None, metadata=_POSITIVE)
    energy_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    forces_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    stress_weight: float | None = field(default=None, metadata=_NON_NEGATIVE)
    energy_factor: float | None = field(default=None, metadata=_NON_NEGATIVE)
    forces_factor: float | None = field(default=None, metadata=_NON_NEGATIVE)
    stress_factor: float | None = field(default=None, metadata=_NON_NEGATIVE)

    @classmethod
    def from_dict(cls, values: Any, where: str) -> SecondStageConfig:
        parsed = cp.parse_dataclass(cls, values, where, ConfigError)
        both = [r for r in ("energy", "forces", "stress") if r in parsed.weights and r in parsed.factors]
        if both:
            raise ConfigError(
                f"{where}: give {both[0]}_weight (replaces the first stage's) or {both[0]}_factor (multiplies "
                "it), not both"
            )
        return parsed

    @property
    def weights(self) -> dict[str, float]:
        """``{role: weight}`` of the weights this stage sets."""
        roles = {"energy": self.energy_weight, "forces": self.forces_weight, "stress": self.stress_weight}
        return {role: w for role, w in roles.items() if w is not None}

    @property
    def factors(self) -> dict[str, float]:
        """``{role: factor}`` of the weights this stage multiplies."""
        roles = {"energy": self.energy_factor, "forces": self.forces_factor, "stress": self.stress_factor}
        return {role: f for role, f in roles.items() if f is not None}
