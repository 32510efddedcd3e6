"""Post-local SGD on DDP (``LocalSGD.enabled: true`` with ``Parallelism.strategy: "ddp"``)."""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ._dist import collective
from .base import register_strategy
from .ddp import DDPStrategy

POLICIES = ("rank_local", "synchronized")


@register_strategy
class LocalSGDStrategy(DDPStrategy):
    """DDP for ``warmup_steps`` optimizer steps, then local SGD with periodic model averaging.

    During warm-up every backward all-reduces the gradients (plain DDP). Afterwards each rank
    steps on its own gradients (DDP's gradient synchronisation is switched off for the forward /
    backward pair) and every ``synchronization_period`` steps the parameters are averaged over
    ranks (:func:`torch.distributed.algorithms.model_averaging.utils.average_parameters`).
    This is the schedule of torch's ``PostLocalSGDOptimizer`` + ``PeriodicModelAverager``,
    written out so that the optimizer state can be synchronised too:

    * ``optimizer_state_policy: "rank_local"`` (default): each rank keeps its own optimizer
      state (``exp_avg``, momentum buffers, ...), as ``PostLocalSGDOptimizer`` does;
    * ``"synchronized"``: at each averaging step the floating-point optimizer state tensors are
      averaged as well, so after a synchronisation parameters *and* optimizer state are equal
      on every rank.

    Step ``s`` (1-based count of :meth:`step` calls) synchronises when ``s > warmup_steps`` and
    ``(s - warmup_steps) % synchronization_period == 0``. Evaluations and checkpoints
    synchronise first (:meth:`consolidate`, called by the loop on every rank): validation losses,
    the best model and checkpoints never depend on which rank's replica they were taken from.
    Under ``"rank_local"`` the optimizer state in a checkpoint is rank 0's (every rank resumes
    from it).
    """

    name = "localsgd"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.warmup_steps = int(self.options.get("warmup_steps", 0))
        self.period = int(self.options.get("synchronization_period", 4))
        self.policy = self.options.get("optimizer_state_policy", "rank_local")
        self.steps = 0
        self.last_synchronized = False

    def _wrap_kwargs(self) -> dict[str, Any]:
        kwargs = super()._wrap_kwargs()
        kwargs["forward_sync_buffers"] = False  # no collective in the forward of a local step
        return kwargs

    @property
    def local_phase(self) -> bool:
        """Whether the coming step is a local one (no gradient all-reduce)."""
        return self.steps >= self.warmup_steps

    def forward(self, batch: Any, **kwargs: Any) -> Any:
        assert self.model is not None, "setup() first"
        cast(DistributedDataParallel, self.model).require_backward_grad_sync = not self.local_phase
        with collective(self, "forward"):
            return self.model(batch, **kwargs)

    def step(self) -> None:
        assert self.optimizer is not None, "setup() first"
        self.clip_gradients()  # this rank's gradients in a local step, the averaged ones otherwise
        with collective(self, "optimizer step"):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.last_synchronized = False
        if self.steps > self.warmup_steps and (self.steps - self.warmup_steps) % self.period == 0:
            with collective(self, "local SGD model averaging"):
                self.synchronize()

    def consolidate(self) -> None:
        """Average now if any rank stepped locally since the last synchronisation."""
        if self.world_size > 1 and self.steps > self.warmup_steps and not self.last_synchronized:
            with collective(self, "local SGD model averaging before evaluation / checkpoint"):
                self.synchronize()

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        self.consolidate()
        return super().model_state_dict()

    @torch.no_grad()
    def synchronize(self) -> None:
        """Average the parameters (and, under ``"synchronized"``, the optimizer state) now."""
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        if self.world_size > 1:
            world = cast("dist.ProcessGroup", dist.group.WORLD)  # initialised: world_size > 1
            average_parameters(iter(self.unwrap().parameters()), world)
            if self.policy == "synchronized":
                tensors = [
                    value
                    for state in cast(torch.optim.Optimizer, self.optimizer).state.values()  # set up
                    for key, value in sorted(state.items())
                    if torch.is_tensor(value) and value.is_floating_point() and key != "step"
                ]
                for tensor in tensors:
                    dist.all_reduce(tensor)
                    tensor.div_(self.world_size)
        self.last_synchronized = True
