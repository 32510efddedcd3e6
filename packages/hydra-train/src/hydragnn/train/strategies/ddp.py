"""DistributedDataParallel (``Parallelism.strategy: "ddp"``), optionally with ZeroRedundancyOptimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from ._dist import DistributedStrategy, collective
from .base import OptimizerFactory, register_strategy

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer


def is_zero_redundancy(optimizer: torch.optim.Optimizer | None) -> TypeGuard[ZeroRedundancyOptimizer]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def align_grad_strides(module: nn.Module) -> list[RemovableHandle]:
    """Give every gradient of a parameter with a size-1 dimension the parameter's own strides.

    Autograd's layout contract ignores the stride of a size-1 dimension, so a ``[1, H]``
    readout weight whose gradient sums two paths (energy, and forces through
    ``create_graph``) gets strides ``(1, 1)`` where the parameter has ``(H, 1)``; DDP compares
    strides exactly and warns "Grad strides do not match bucket view strides" on every run. The
    hook re-strides such a gradient as a view (the same memory, no copy), before it is
    accumulated; any other layout is left as it is. Returns the hook handles.
    """
    handles = []
    for param in module.parameters():
        if param.requires_grad and 1 in param.shape:
            handles.append(param.register_hook(_restride_hook(param.shape, param.stride())))
    return handles


def _restride_hook(shape: torch.Size, stride: tuple[int, ...]):
    def hook(grad: torch.Tensor) -> torch.Tensor | None:
        if grad.layout != torch.strided or grad.shape != shape or grad.stride() == stride:
            return None
        if any(n != 1 and a != b for n, a, b in zip(shape, grad.stride(), stride, strict=True)):
            return None  # a real layout difference: not a view of the same memory
        return grad.as_strided(shape, stride, grad.storage_offset())

    return hook


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
        self._stride_hooks = align_grad_strides(self._module)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        with collective(self, "DDP setup (parameter broadcast)"):
            self.model = DistributedDataParallel(self._module, device_ids=device_ids, **self._wrap_kwargs())
        self.optimizer = optimizer_factory(self._module.parameters())

    def teardown(self) -> None:
        """Remove the gradient-stride hooks from the model, then drop the engine."""
        for handle in getattr(self, "_stride_hooks", ()):
            handle.remove()
        self._stride_hooks = []
        super().teardown()

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        assert self.optimizer is not None, "setup() first"
        if is_zero_redundancy(self.optimizer):
            with collective(self, "ZeroRedundancyOptimizer.consolidate_state_dict"):
                self.optimizer.consolidate_state_dict(to=0)
            return self.optimizer.state_dict() if self.rank == 0 else None
        return self.optimizer.state_dict()
