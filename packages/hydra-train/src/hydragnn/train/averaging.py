"""An exponential moving average of the weights (``Training.EMA``), kept beside the live model.

The first update copies the parameters, every later one folds them in as
``avg <- d * avg + (1 - d) * param`` (``torch._foreach_lerp_``, as torch's
``get_ema_multi_avg_fn``), where ``d`` is ``decay``, or with ``warmup`` ``min(decay, (1 + n) /
(10 + n))`` after ``n`` updates (torch-ema's ``use_num_updates`` and timm's warm-up): a run of a
few dozen steps then validates and saves an average of its recent weights, not of its initial
ones. The update count is in the checkpoint, so a resumed run continues the same schedule.
:meth:`WeightAverage.applied` swaps the averaged parameters into the live module for evaluation
or saving and puts the live ones back after; buffers always stay the live model's. When training
ends, the last live weights are kept instead of the best average if they validate better. The average needs the full parameters on every rank (strategies none, ddp,
localsgd, deepspeed ZeRO 1-2), where every rank's average is the same.

Parameters are matched by name, never by position: torch's ``AveragedModel`` keeps a deep copy
and pairs its parameters with the live ones in order, and a deep copy of an e3nn module
re-registers its generated submodules after the others (its ``__setstate__`` rebuilds them), so
MACE's averaged and live parameters were paired across shapes and training crashed at the first
update. The checkpoint format stays ``AveragedModel``'s (``n_averaged`` and ``module.<name>``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from .callbacks import Callback

if TYPE_CHECKING:
    from .callbacks import LoopView

__all__ = ["WeightAverage"]

PREFIX = "module."


class WeightAverage(Callback):
    """EMA of a module's parameters, by name; as a callback it folds the parameters in after every
    optimizer step, validates with the averaged ones (so the best model kept is the average), and
    keeps its average in the checkpoint.

    Args:
        module: the plain model whose parameters are averaged (not a DDP wrapper).
        decay: the EMA decay in (0, 1).
        warmup: lower the decay over the first updates (:meth:`decay_at`).
    """

    key = "ema"

    def __init__(self, module: nn.Module, decay: float, warmup: bool = True) -> None:
        self.decay, self.warmup = decay, warmup
        self.names = [name for name, _ in module.named_parameters()]
        self.average: dict[str, torch.Tensor] = {}
        self._updates = 0

    def _live(self, module: nn.Module) -> list[torch.Tensor]:
        """The module's parameters in :attr:`names` order; the average moved to their device
        (a checkpoint's average loads on the CPU)."""
        params = dict(module.named_parameters())
        missing = [name for name in self.names if name not in params]
        if missing or len(params) != len(self.names):
            raise RuntimeError(f"EMA: the module's parameters changed since the average began (missing {missing[:5]})")
        live = [params[name].detach() for name in self.names]
        for name, p in zip(self.names, live, strict=True):
            if name in self.average and self.average[name].device != p.device:
                self.average[name] = self.average[name].to(p.device)
        return live

    def decay_at(self, updates: int) -> float:
        """The decay applied by the update after ``updates`` earlier ones."""
        return min(self.decay, (1.0 + updates) / (10.0 + updates)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        """Fold the current parameters of ``module`` into the average (after an optimizer step)."""
        live = self._live(module)
        if not self.average:
            self.average = {name: p.clone() for name, p in zip(self.names, live, strict=True)}
        else:
            averaged = [self.average[name] for name in self.names]
            torch._foreach_lerp_(averaged, live, 1.0 - self.decay_at(self._updates))  # pyright: ignore[reportPrivateImportUsage]  # a torch kernel outside torch.__all__
        self._updates += 1

    @property
    def updates(self) -> int:
        """Updates folded in so far."""
        return self._updates

    @contextlib.contextmanager
    def applied(self, module: nn.Module) -> Iterator[None]:
        """Within the block ``module`` holds the averaged parameters (a no-op before the first update)."""
        if self.updates == 0:
            yield
            return
        live = self._live(module)
        saved = [p.clone() for p in live]
        with torch.no_grad():
            for name, p in zip(self.names, live, strict=True):
                p.copy_(self.average[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for p, kept in zip(live, saved, strict=True):
                    p.copy_(kept)

    def after_step(self, loop: LoopView, graphs: int, loss: float) -> None:
        self.update(loop.module)

    def evaluating(self, loop: LoopView) -> contextlib.AbstractContextManager[None]:
        return self.applied(loop.module)

    def on_fit_start(self, loop: LoopView) -> None:
        loop.best_kind = "EMA weights"

    def on_training_end(self, loop: LoopView) -> None:
        """Every epoch was validated, and the best kept, with the averaged weights; a short run's
        average can still lag behind what the optimizer reached. The last live weights are
        validated once more and kept when their loss is lower (every rank sees the same averaged
        loss, so every rank decides alike)."""
        if not loop.history or loop.best_state is None:
            return
        loss = loop.validation_loss()
        if loss is None or not loss < loop.best_loss:
            return
        loop.log(
            f"the last epoch's raw weights (val loss {loss:.6g}) beat the best EMA weights (epoch "
            f"{loop.best_epoch}, val loss {loop.best_loss:.6g}): they are kept instead (the average lagged "
            "behind; train longer or lower Training.EMA.decay)"
        )
        loop.keep_state(loop.live_state(), loss, int(loop.history[-1]["epoch"]), "raw weights")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (loads with ``weights_only=True``), keyed as ``AveragedModel`` keys them."""
        state = {PREFIX + name: t.detach().cpu().clone() for name, t in self.average.items()}
        state["n_averaged"] = torch.tensor(self._updates, dtype=torch.long)
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict` (or an ``AveragedModel`` state: its buffers are ignored).

        Raises:
            RuntimeError: a checkpoint without the average of one of the module's parameters.
        """
        updates = int(state["n_averaged"])
        if updates == 0:
            self.average, self._updates = {}, 0
            return
        missing = [name for name in self.names if PREFIX + name not in state]
        if missing:
            raise RuntimeError(f"EMA checkpoint: no average for parameters {missing[:5]}")
        self.average = {name: state[PREFIX + name].detach().clone() for name in self.names}
        self._updates = updates
