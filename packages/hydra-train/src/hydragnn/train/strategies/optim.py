"""``Training.Optimizer`` -> an optimizer factory (``params -> torch.optim.Optimizer``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "AdamW": torch.optim.AdamW,
    "Adam": torch.optim.Adam,
    "SGD": torch.optim.SGD,
    "RMSprop": torch.optim.RMSprop,
    "Adagrad": torch.optim.Adagrad,
}
"""``Optimizer.type`` -> torch optimizer class."""

_WITH_MOMENTUM = ("SGD", "RMSprop")
_KEYS = {"type", "learning_rate", "weight_decay", "momentum", "use_zero_redundancy"}
_WHERE = "NeuralNetwork.Training.Optimizer"


def _number(cfg: Mapping[str, Any], key: str, default: float | None, *, positive: bool) -> float | None:
    value = cfg.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{_WHERE}.{key}: expected a number, found {value!r}")
    if (positive and value <= 0) or (not positive and value < 0):
        raise ConfigError(f"{_WHERE}.{key}: expected a number {'> 0' if positive else '>= 0'}, found {value!r}")
    return float(value)


class OptimizerBuilder:
    """Callable ``factory(params) -> torch.optim.Optimizer`` built from ``Training.Optimizer``.

    Attributes:
        cls: the torch optimizer class; ``kwargs``: its keyword arguments (``lr``, ...);
        use_zero_redundancy: wrap in :class:`torch.distributed.optim.ZeroRedundancyOptimizer`
            when a process group with more than one rank exists (each rank then keeps the
            optimizer state of its shard of the parameters).
    """

    def __init__(self, cls: type[torch.optim.Optimizer], kwargs: dict[str, Any], use_zero_redundancy: bool) -> None:
        self.cls = cls
        self.kwargs = dict(kwargs)
        self.use_zero_redundancy = use_zero_redundancy

    def __call__(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = [p for p in params if p.requires_grad]
        if self.use_zero_redundancy and dist.is_available() and dist.is_initialized():
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=self.cls, **self.kwargs)
        return self.cls(params, **self.kwargs)

    def __repr__(self) -> str:
        zero = ", ZeroRedundancyOptimizer" if self.use_zero_redundancy else ""
        return f"OptimizerBuilder({self.cls.__name__}, {self.kwargs}{zero})"


def build_optimizer_factory(optimizer_config: Mapping[str, Any]) -> OptimizerBuilder:
    """Parse ``Training.Optimizer``.

    Keys: ``type`` (AdamW, Adam, SGD, RMSprop, Adagrad; default AdamW), ``learning_rate``
    (> 0, required), ``weight_decay`` (>= 0, default 0), ``momentum`` (SGD / RMSprop only,
    >= 0, default 0), ``use_zero_redundancy`` (bool, default false; valid with strategy
    ``ddp`` only, checked by :func:`~hydragnn.train.strategies.make_strategy`).

    Raises:
        ConfigError: unknown key or type, or a value out of range; the message names the key.
    """
    if not isinstance(optimizer_config, Mapping):
        raise ConfigError(f"{_WHERE}: expected an object, found {type(optimizer_config).__name__}")
    unknown = sorted(set(optimizer_config) - _KEYS)
    if unknown:
        raise ConfigError(f"{_WHERE}: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    kind = optimizer_config.get("type", "AdamW")
    if kind not in OPTIMIZERS:
        raise ConfigError(f"{_WHERE}.type: expected one of {sorted(OPTIMIZERS)}, found {kind!r}")
    if "learning_rate" not in optimizer_config:
        raise ConfigError(f"{_WHERE}.learning_rate: required (a number > 0)")
    kwargs: dict[str, Any] = {"lr": _number(optimizer_config, "learning_rate", None, positive=True)}
    kwargs["weight_decay"] = _number(optimizer_config, "weight_decay", 0.0, positive=False)
    if "momentum" in optimizer_config:
        if kind not in _WITH_MOMENTUM:
            raise ConfigError(f"{_WHERE}.momentum: only for {list(_WITH_MOMENTUM)}, not {kind!r}")
        kwargs["momentum"] = _number(optimizer_config, "momentum", 0.0, positive=False)
    zero = optimizer_config.get("use_zero_redundancy", False)
    if not isinstance(zero, bool):
        raise ConfigError(f"{_WHERE}.use_zero_redundancy: expected true or false, found {zero!r}")
    return OptimizerBuilder(OPTIMIZERS[kind], kwargs, zero)
