"""``Training.Optimizer`` -> an optimizer factory (``params -> torch.optim.Optimizer``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..config_sections import OptimizerConfig
from ..errors import ConfigError

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "AdamW": torch.optim.AdamW,
    "Adam": torch.optim.Adam,
    "SGD": torch.optim.SGD,
    "RMSprop": torch.optim.RMSprop,
    "Adagrad": torch.optim.Adagrad,
}
"""``Optimizer.type`` -> torch optimizer class."""

_WHERE = "NeuralNetwork.Training.Optimizer"


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


def build_optimizer_factory(optimizer_config: OptimizerConfig | Mapping[str, Any]) -> OptimizerBuilder:
    """The optimizer factory of ``Training.Optimizer``.

    Args:
        optimizer_config: the parsed :class:`~hydragnn.train.config_sections.OptimizerConfig`
            (what the pipeline passes), or the raw JSON section, parsed here by that class;
            ``learning_rate`` is required in a raw section. ``use_zero_redundancy`` is valid
            with strategy ``ddp`` only (checked with the Parallelism section).

    Raises:
        ConfigError: unknown key or type, or a value out of range; the message names the key.
    """
    cfg = optimizer_config
    if not isinstance(cfg, OptimizerConfig):
        if isinstance(cfg, Mapping) and "learning_rate" not in cfg:
            raise ConfigError(f"{_WHERE}.learning_rate: required (a number > 0)")
        cfg = OptimizerConfig.from_dict(cfg, _WHERE)
    kwargs: dict[str, Any] = {"lr": cfg.learning_rate, "weight_decay": cfg.weight_decay}
    if cfg.momentum is not None:
        kwargs["momentum"] = cfg.momentum
    return OptimizerBuilder(OPTIMIZERS[cfg.type], kwargs, cfg.use_zero_redundancy)
