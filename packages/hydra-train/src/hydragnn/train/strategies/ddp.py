"""DistributedDataParallel (``Parallelism.strategy: "ddp"``), optionally with ZeroRedundancyOptimizer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ._dist import DistributedStrategy, collective
from .base import OptimizerFactory, register_strategy


def is_zero_redundancy(optimizer: torch.optim.Optimizer | None) -> bool:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


@register_strategy
class DDPStrategy(DistributedStrategy):
    """Replicated model, gradients averaged over ranks in backward (gloo on CPU, nccl on CUDA).

    Options (``Training.Parallelism``): ``find_unused_parameters`` (default false; set it for
    stacks with parameters that some steps do not use), ``timeout_s``.

    Checkpoints: :meth:`model_state_dict` is the plain model's state on every rank (replicas
    are identical). :meth:`optimizer_state_dict` is the optimizer's own state on every rank; with
    ``Optimizer.use_zero_redundancy`` it is consolidated (a collective every rank must call)
    and returned on rank 0 only (``None`` elsewhere). :meth:`load_optimizer_state_dict` takes the
    full (consolidated) state on every rank.
    """

    name = "ddp"

    def _wrap_kwargs(self) -> dict[str, Any]:
        return {"find_unused_parameters": bool(self.options.get("find_unused_parameters", False))}

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> None:
        self._module = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        with collective(self, "DDP setup (parameter broadcast)"):
            self.model = DistributedDataParallel(self._module, device_ids=device_ids, **self._wrap_kwargs())
        self.optimizer = optimizer_factory(self._module.parameters())

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        assert self.optimizer is not None, "setup() first"
        if is_zero_redundancy(self.optimizer):
            with collective(self, "ZeroRedundancyOptimizer.consolidate_state_dict"):
                self.optimizer.consolidate_state_dict(to=0)
            return self.optimizer.state_dict() if self.rank == 0 else None
        return self.optimizer.state_dict()
