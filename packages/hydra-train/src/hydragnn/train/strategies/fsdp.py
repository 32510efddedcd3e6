"""FullyShardedDataParallel v1 (``Parallelism.strategy: "fsdp"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ._dist import DistributedStrategy, broadcast_module, collective
from .base import OptimizerFactory, register_strategy

if TYPE_CHECKING:
    from torch.distributed.fsdp import FullyShardedDataParallel

    _StrategyBase = DistributedStrategy  # the strategies the mixin is combined with
else:
    _StrategyBase = object

FULL = StateDictOptions(full_state_dict=True, cpu_offload=False)


class ShardedStateMixin(_StrategyBase):
    """Full (unsharded) model / optimizer state through ``torch.distributed.checkpoint.state_dict``.

    :meth:`model_state_dict` gathers the full parameters on every rank (a collective) with the
    plain model's keys. :meth:`optimizer_state_dict` gathers the full optimizer state on every
    rank, keyed by parameter name (the ``torch.distributed.checkpoint`` layout, not the integer
    ids of a plain optimizer); :meth:`load_optimizer_state_dict` takes that layout.
    """

    @property
    def _wrapped(self) -> nn.Module:
        """The wrapped model (set by ``setup()``)."""
        return cast(nn.Module, self.model)

    @property
    def _optimizer(self) -> torch.optim.Optimizer:
        """The optimizer (built by ``setup()``)."""
        return cast(torch.optim.Optimizer, self.optimizer)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        with collective(self, "full model state dict"):
            state = cast("dict[str, torch.Tensor]", get_model_state_dict(self._wrapped, options=FULL))  # full: tensors
        return {k: v.detach().clone() for k, v in state.items()}

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with collective(self, "load full model state dict"):
            set_model_state_dict(
                self._wrapped, cast("dict[str, Any]", state), options=StateDictOptions(full_state_dict=True)
            )

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        with collective(self, "full optimizer state dict"):
            return get_optimizer_state_dict(self._wrapped, self._optimizer, options=FULL)

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        with collective(self, "load full optimizer state dict"):
            set_optimizer_state_dict(
                self._wrapped, self._optimizer, state, options=StateDictOptions(full_state_dict=True)
            )


@register_strategy
class FSDPStrategy(ShardedStateMixin, DistributedStrategy):
    """FSDP v1, the whole model as one ``FULL_SHARD`` unit with ``use_orig_params=True``.

    On CPU it needs ``device_id=torch.device("cpu")`` (``None`` fails with "FSDP needs a
    non-CPU accelerator device"). Outside :meth:`forward` the parameters of :meth:`unwrap` are
    shards: evaluate through :meth:`forward`, checkpoint through :meth:`model_state_dict`.
    MLIP forces (``autograd.grad`` inside the forward, ``create_graph=True``) work: the whole
    forward, including that inner backward, runs with the parameters unsharded.
    """

    name = "fsdp"

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        self._module = model.to(self.device)
        with collective(self, "FSDP setup"):
            broadcast_module(self._module)  # sync_module_states=True needs a GPU
            self.model = FullyShardedDataParallel(
                self._module,
                device_id=self.device,
                sharding_strategy=ShardingStrategy.FULL_SHARD,
                use_orig_params=True,
                sync_module_states=False,
            )
        self.optimizer = optimizer_factory(self.model.parameters())

    def clip_gradients(self) -> torch.Tensor | None:
        """FSDP's own clipping: the global norm over every rank's gradient shards (a collective)."""
        if self.max_grad_norm is None:
            return None
        with collective(self, "FSDP gradient clipping"):
            return cast("FullyShardedDataParallel", self.model).clip_grad_norm_(self.max_grad_norm)  # wrapped at setup
