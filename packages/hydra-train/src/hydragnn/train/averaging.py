"""An exponential moving average of the weights (``Training.EMA``), kept beside the live model.

The averaging itself is torch's :class:`torch.optim.swa_utils.AveragedModel` with
:func:`~torch.optim.swa_utils.get_ema_multi_avg_fn` (the first update copies, then
``avg <- decay * avg + (1 - decay) * param``). :meth:`WeightAverage.applied` swaps the averaged
parameters into the live module for evaluation or saving and puts the live ones back after;
buffers always stay the live model's. The average needs the full parameters on every rank
(strategies none, ddp, localsgd, deepspeed ZeRO 1-2), where every rank's average is the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

__all__ = ["WeightAverage"]


class WeightAverage:
    """EMA of a module's parameters.

    Args:
        module: the plain model whose parameters are averaged (not a DDP wrapper).
        decay: the EMA decay in (0, 1).
    """

    def __init__(self, module: nn.Module, decay: float) -> None:
        self.decay = decay
        self.average = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=False)

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        """Fold the current parameters of ``module`` into the average (after an optimizer step)."""
        self.average.update_parameters(module)

    @property
    def updates(self) -> int:
        """Updates folded in so far."""
        return int(self.average.n_averaged)

    @contextlib.contextmanager
    def applied(self, module: nn.Module) -> Iterator[None]:
        """Within the block ``module`` holds the averaged parameters (a no-op before the first update)."""
        if self.updates == 0:
            yield
            return
        live = [p.detach().clone() for p in module.parameters()]
        with torch.no_grad():
            for p, avg in zip(module.parameters(), self.average.module.parameters(), strict=True):
                p.copy_(avg)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, saved in zip(module.parameters(), live, strict=True):
                    p.copy_(saved)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (loads with ``weights_only=True``)."""
        return {k: v.detach().cpu().clone() for k, v in self.average.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.average.load_state_dict(state)
