"""Training strategies: single process, DDP, FSDP (v1), FSDP2, DeepSpeed, post-local SGD.

:func:`make_strategy` turns the ``NeuralNetwork.Training`` section into a
:class:`~hydragnn.train.strategies.base.Strategy`; :func:`build_optimizer_factory` turns its
``Optimizer`` section into the factory that :meth:`Strategy.setup` calls. Distributed runs are
started with ``torchrun``; a distributed strategy initialises the default process group from
torchrun's environment (:func:`init_distributed`) unless one already exists, and destroys it in
``teardown()`` only if it created it.

Support matrix (measured with ``torchrun --nproc_per_node=2`` on gloo, CPU; see
``tests/test_strategies_dist.py``):

==========  ===========  ==========================  =========================================
strategy    MLIP forces  model_state_dict            optimizer_state_dict
==========  ===========  ==========================  =========================================
none        yes          full                        full (plain torch layout)
ddp         yes          full, every rank            full, every rank; with
                                                     ``use_zero_redundancy``: consolidated on
                                                     rank 0 (``None`` elsewhere)
localsgd    yes          every rank's own (equal     every rank's own (``rank_local``) or equal
                         right after a sync)         after a sync (``synchronized``)
fsdp        yes          full, every rank            full, every rank, keyed by parameter name
fsdp2       yes          full, every rank            full, every rank, keyed by parameter name
deepspeed   ZeRO 1/2     full, every rank (ZeRO-3    ``None`` (ZeRO-partitioned; use DeepSpeed's
            (ZeRO-3: a   gathers)                    ``save_checkpoint``)
            ConfigError)
==========  ===========  ==========================  =========================================

Every ``model_state_dict()`` loads (strictly) into a plain single-process ``HydraModel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from . import ddp, deepspeed_engine, fsdp, fsdp2, localsgd  # noqa: F401  (register the strategies)
from ._dist import DEFAULT_TIMEOUT_S, destroy_distributed, init_distributed
from .base import STRATEGIES, OptimizerFactory, Strategy, register_strategy
from .localsgd import POLICIES
from .optim import OPTIMIZERS, OptimizerBuilder, build_optimizer_factory

__all__ = [
    "OPTIMIZERS",
    "STRATEGIES",
    "OptimizerBuilder",
    "OptimizerFactory",
    "Strategy",
    "build_optimizer_factory",
    "destroy_distributed",
    "init_distributed",
    "make_strategy",
    "parse_parallelism",
    "register_strategy",
]

_WHERE = "NeuralNetwork.Training"
CONFIG_STRATEGIES = ("none", "ddp", "fsdp", "fsdp2", "deepspeed")
"""Values of ``Parallelism.strategy`` (post-local SGD is ``ddp`` + ``LocalSGD.enabled``)."""
_PARALLELISM_KEYS = {"strategy", "find_unused_parameters", "zero_stage", "timeout_s"}
_LOCALSGD_KEYS = {"enabled", "warmup_steps", "synchronization_period", "optimizer_state_policy"}


def _section(training: Mapping[str, Any] | object, name: str) -> dict[str, Any]:
    value = training.get(name) if isinstance(training, Mapping) else getattr(training, name, None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{_WHERE}.{name}: expected an object, found {type(value).__name__}")
    return dict(value)


def _check_keys(section: dict[str, Any], allowed: set[str], name: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(f"{_WHERE}.{name}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _int(section: dict[str, Any], key: str, default: int, minimum: int, name: str) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{_WHERE}.{name}.{key}: expected an integer >= {minimum}, found {value!r}")
    return value


def _bool(section: dict[str, Any], key: str, name: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{_WHERE}.{name}.{key}: expected true or false, found {value!r}")
    return value


def parse_parallelism(training: Mapping[str, Any] | object) -> tuple[str, dict[str, Any]]:
    """Validate ``Parallelism`` / ``LocalSGD`` (and ``Optimizer.use_zero_redundancy``).

    Returns:
        ``(registry name, options)``: the registry name is ``"localsgd"`` when
        ``LocalSGD.enabled``, else ``Parallelism.strategy``; options merge both sections with
        their defaults filled in.

    Raises:
        ConfigError: naming the JSON path, the expected and the found value.
    """
    par = _section(training, "Parallelism")
    lsgd = _section(training, "LocalSGD")
    opt = _section(training, "Optimizer")
    _check_keys(par, _PARALLELISM_KEYS, "Parallelism")
    _check_keys(lsgd, _LOCALSGD_KEYS, "LocalSGD")
    strategy = par.get("strategy", "none")
    if strategy not in CONFIG_STRATEGIES:
        raise ConfigError(
            f"{_WHERE}.Parallelism.strategy: expected one of {list(CONFIG_STRATEGIES)}, found {strategy!r}"
        )
    timeout_s = par.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ConfigError(f"{_WHERE}.Parallelism.timeout_s: expected a number > 0, found {timeout_s!r}")
    zero_stage = par.get("zero_stage", 1)
    if isinstance(zero_stage, bool) or zero_stage not in (1, 2, 3):
        raise ConfigError(f"{_WHERE}.Parallelism.zero_stage: expected 1, 2 or 3, found {zero_stage!r}")
    if "zero_stage" in par and strategy != "deepspeed":
        raise ConfigError(f"{_WHERE}.Parallelism.zero_stage: only with strategy 'deepspeed', not {strategy!r}")
    options: dict[str, Any] = {
        "timeout_s": float(timeout_s),
        "find_unused_parameters": _bool(par, "find_unused_parameters", "Parallelism"),
        "zero_stage": zero_stage,
    }
    enabled = _bool(lsgd, "enabled", "LocalSGD")
    options["warmup_steps"] = _int(lsgd, "warmup_steps", 0, 0, "LocalSGD")
    options["synchronization_period"] = _int(lsgd, "synchronization_period", 4, 1, "LocalSGD")
    policy = lsgd.get("optimizer_state_policy", "rank_local")
    if policy not in POLICIES:
        raise ConfigError(
            f"{_WHERE}.LocalSGD.optimizer_state_policy: expected one of {list(POLICIES)}, found {policy!r}"
        )
    options["optimizer_state_policy"] = policy
    zero = opt.get("use_zero_redundancy", False)
    if zero is True and strategy != "ddp":
        raise ConfigError(
            f"{_WHERE}.Optimizer.use_zero_redundancy: only with Parallelism.strategy 'ddp', found {strategy!r}"
        )
    if enabled:
        if strategy != "ddp":
            raise ConfigError(f"{_WHERE}.LocalSGD.enabled: requires Parallelism.strategy 'ddp', found {strategy!r}")
        if zero is True:
            raise ConfigError(
                f"{_WHERE}.LocalSGD.enabled: not with Optimizer.use_zero_redundancy (sharded state cannot be averaged)"
            )
        return "localsgd", options
    return strategy, options


def make_strategy(training: Mapping[str, Any] | object) -> Strategy:
    """Build the strategy of a ``NeuralNetwork.Training`` section.

    Args:
        training: the raw JSON dict of ``NeuralNetwork.Training``, or any object with
            attributes ``Parallelism`` / ``LocalSGD`` (/ ``Optimizer``) holding those sections
            as dicts (a missing section takes every default: strategy ``"none"``).

    Returns:
        An unset-up :class:`Strategy`. A distributed one has already initialised the process
        group (from torchrun's environment, or a one-process group without it), so loaders
        built afterwards shard the data.

    Raises:
        ConfigError: an invalid section (see :func:`parse_parallelism`), or DeepSpeed asked
            for but not installed.
    """
    name, options = parse_parallelism(training)
    return STRATEGIES[name](options)
