"""FSDP2, ``torch.distributed.fsdp.fully_shard`` (``Parallelism.strategy: "fsdp2"``)."""

from __future__ import annotations

from torch import nn

from ._dist import DistributedStrategy, broadcast_module, collective
from .base import OptimizerFactory, register_strategy
from .fsdp import ShardedStateMixin


@register_strategy
class FSDP2Strategy(ShardedStateMixin, DistributedStrategy):
    """``fully_shard`` on the root module over a 1-D device mesh of all ranks.

    Parameters become ``DTensor`` shards (``Shard(0)``); the forward all-gathers them and
    re-shards after the forward (``reshard_after_forward=True``); the backward reduce-scatters
    gradients. :meth:`unwrap` is the sharded module itself (its ``loss`` needs no parameters).
    Checkpoints as in :class:`~hydragnn.train.strategies.fsdp.FSDPStrategy` (full state on
    every rank). Parameters are broadcast from rank 0 before sharding so every rank starts equal.
    """

    name = "fsdp2"

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self._module = model.to(self.device)
        with collective(self, "FSDP2 setup"):
            broadcast_module(self._module)
            mesh = init_device_mesh(self.device.type, (self.world_size,))
            fully_shard(self._module, mesh=mesh, reshard_after_forward=True)
        self.model = self._module
        self.optimizer = optimizer_factory(self._module.parameters())
