"""Per-feature standardisation by running statistics, the same function in training and inference.

:class:`RunningStandardise` maps ``x [B, F]`` to ``(x - mean) / sqrt(var + eps)`` with ``mean`` and
``var [F]`` buffers. Unlike ``BatchNorm1d`` in training mode, the output never uses the current
batch's statistics: a row's output depends on that row and the buffers only, so batch == single
and a padded batch gives the real rows exactly their unpadded outputs, in training as in
evaluation, and a batch of one graph is fine. The forward never changes the buffers: the owner
calls :meth:`RunningStandardise.update` with the training batch's rows after the forward (the first
batch sets the statistics, later ones move them by ``momentum``), outside any ``torch.func``
transform (the ``"func"`` derivative engine runs the forward inside ``torch.func.grad``, where a
buffer cannot be mutated), so both derivative engines, eager and compiled, train alike; in a
distributed run the statistics are those of all ranks' rows (one small all-reduce per step), so
every rank keeps the same.
Gradients do not flow through the statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn


def _distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


class RunningStandardise(nn.Module):
    """``x [B, F] -> (x - running_mean) / sqrt(running_var + eps)``; :meth:`update` moves the buffers.

    Args:
        width: F.
        momentum: weight of a new batch in the running statistics (after the first, which sets them).
        eps: added to the variance.
    """

    running_mean: torch.Tensor  # [F] buffers
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor  # [] int64

    def __init__(self, width: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        self.momentum = momentum
        self.eps = eps
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("running_var", torch.ones(width))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.running_mean, self.running_var
        return (x - mean.to(x.dtype)) * torch.rsqrt(var.to(x.dtype) + self.eps)

    def update(self, x: torch.Tensor) -> None:
        """Move the statistics towards those of the rows ``x [B, F]`` of a training batch (of every
        rank's rows together in a distributed run; no rows anywhere: no change).

        The buffers are replaced by new tensors, never changed in place: the forward of this step
        (eager or compiled) may have saved them for its backward. It runs eagerly under
        ``torch.compile`` (after the compiled forward).
        """
        _update(self, x)

    def extra_repr(self) -> str:
        return f"{self.running_mean.shape[0]}, momentum={self.momentum}, eps={self.eps}"


def _update_statistics(norm: RunningStandardise, x: torch.Tensor) -> None:
    """:meth:`RunningStandardise.update` (eager under ``torch.compile``, without gradient)."""
    with torch.no_grad():
        x = x.detach().to(torch.float64)  # moments in float64: E[x^2] - E[x]^2 without cancellation
        # count, sum and sum of squares of the rows, over every rank of a distributed run (each
        # rank calls update once per step, with or without rows), so every rank keeps the same
        # statistics: those of the global batch, as SyncBatchNorm's
        moments = torch.cat([x.new_full((1,), float(x.shape[0])), x.sum(0), x.square().sum(0)])
        if _distributed():
            torch.distributed.all_reduce(moments)
        width = x.shape[1]
        count, total, squares = moments[0], moments[1 : 1 + width], moments[1 + width :]
        if not _distributed() and x.shape[0] == 0:
            return
        batch_mean = total / count.clamp_min(1)
        batch_var = (squares / count.clamp_min(1) - batch_mean.square()).clamp_min(0)
        dtype = norm.running_mean.dtype
        batch_mean, batch_var = batch_mean.to(dtype), batch_var.to(dtype)
        batch_var = torch.where(count > 1, batch_var, norm.running_var)  # one row: no variance to learn
        # the first batch sets the statistics, later ones move them by momentum; no rows: no change
        # (tensor weights: no host sync)
        w = torch.where(norm.num_batches_tracked == 0, 1.0, norm.momentum).to(dtype) * (count > 0)
        norm.running_mean = torch.lerp(norm.running_mean, batch_mean, w)
        norm.running_var = torch.lerp(norm.running_var, batch_var, w)
        norm.num_batches_tracked = norm.num_batches_tracked + (count > 0).long()


_update = cast("Callable[[RunningStandardise, torch.Tensor], None]", torch.compiler.disable(_update_statistics))
