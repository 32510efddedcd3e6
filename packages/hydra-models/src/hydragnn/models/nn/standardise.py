"""Per-feature standardisation by running statistics, the same function in training and inference.

:class:`RunningStandardise` maps ``x [B, F]`` to ``(x - mean) / sqrt(std^2 + eps)`` with ``mean`` and
``std [F]`` buffers. Unlike ``BatchNorm1d`` in training mode, the output never uses the current
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

The buffers hold the standard deviation, not the variance, and the forward takes
``hypot(std, sqrt(eps))``: whenever the rows are finite in the model's dtype, so are the
statistics (a variance of float32 rows beyond 1.8e19 would overflow). A row that is not finite
does not move them (the training loop rejects or skips its batch; the statistics stay usable).

Scale drift: the heads cannot see the scale of their input, so nothing in the loss stops the
encoder's output from growing; some encoders (PNAEq, DimeNet at a high learning rate) let it grow
by many orders of magnitude (docs/notes/upstream_configs_dead_heads.md). The training loop reports
it (``hydragnn.train.health.HeadInputScale``).
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
    """``x [B, F] -> (x - running_mean) / sqrt(running_std^2 + eps)``; :meth:`update` moves the buffers.

    Args:
        width: F.
        momentum: weight of a new batch in the running statistics (after the first, which sets them).
        eps: added to the variance (std^2).
    """

    running_mean: torch.Tensor  # [F] buffers
    running_std: torch.Tensor
    num_batches_tracked: torch.Tensor  # [] int64

    def __init__(self, width: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        self.momentum = momentum
        self.eps = eps
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("running_std", torch.ones(width))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.running_mean.to(x.dtype), self.running_std.to(x.dtype)
        return (x - mean) / torch.hypot(std, torch.full_like(std, self.eps**0.5))

    def update(self, x: torch.Tensor) -> None:
        """Move the statistics towards those of the rows ``x [B, F]`` of a training batch (of every
        rank's rows together in a distributed run; no finite rows anywhere: no change; a row with a
        non-finite value is left out).

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
        finite = torch.isfinite(x).all(1, keepdim=True)  # [B, 1]: other rows do not count
        x = torch.where(finite, x, 0.0)
        # count, sum and sum of squares of the rows, over every rank of a distributed run (each
        # rank calls update once per step, with or without rows), so every rank keeps the same
        # statistics: those of the global batch, as SyncBatchNorm's
        moments = torch.cat([finite.sum(0).to(x.dtype), x.sum(0), x.square().sum(0)])
        if _distributed():
            torch.distributed.all_reduce(moments)
        width = x.shape[1]
        count, total, squares = moments[0], moments[1 : 1 + width], moments[1 + width :]
        if not _distributed() and x.shape[0] == 0:
            return
        batch_mean = total / count.clamp_min(1)
        batch_var = (squares / count.clamp_min(1) - batch_mean.square()).clamp_min(0)
        batch_var = torch.where(count > 1, batch_var, norm.running_std.double().square())  # one row: no spread
        # the first batch sets the statistics, later ones move them (mean and variance) by momentum;
        # no rows: no change (tensor weights: no host sync); float64 until stored
        w = torch.where(norm.num_batches_tracked == 0, 1.0, norm.momentum).double() * (count > 0)
        mean = torch.lerp(norm.running_mean.double(), batch_mean, w)
        std = torch.lerp(norm.running_std.double().square(), batch_var, w).sqrt()
        dtype = norm.running_mean.dtype
        largest = torch.finfo(dtype).max  # the mean and std of finite rows fit unless they reach it
        norm.running_mean = mean.clamp(-largest, largest).to(dtype)
        norm.running_std = std.clamp_max(largest).to(dtype)
        norm.num_batches_tracked = norm.num_batches_tracked + (count > 0).long()


_update = cast("Callable[[RunningStandardise, torch.Tensor], None]", torch.compiler.disable(_update_statistics))
