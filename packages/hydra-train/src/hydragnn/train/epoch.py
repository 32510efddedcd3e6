"""One training pass over a loader: forward, loss, the non-finite-loss policy, step, running
metrics, progress (the loop of :func:`hydragnn.train.seed_api.train_validate_test` runs it per epoch,
with its callbacks' ``before_forward``, ``before_step`` and ``after_step`` around each batch).

One host read per batch, before the backward: the batch's losses (total and per head, one small
transfer), whose finiteness the non-finite policy needs and whose values the running metrics
accumulate on the host (in double precision, summed across ranks once per epoch). Under
torch.distributed the ranks then agree on finiteness by one all-reduce of a flag.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from .errors import TrainingAborted
from .progress import Progress, fmt_losses
from .strategies.base import Strategy

if TYPE_CHECKING:
    from .callbacks import LoopView


def train_epoch(
    strategy: Strategy,
    loader: Any,
    epoch: int,
    nan_policy: str,
    progress: Progress,
    loop: LoopView | None = None,
) -> tuple[float, dict[str, float], int, float]:
    """One pass over ``loader``; with a ``loop``, its callbacks run around each batch and its
    ``train_batches`` counts every forward (skipped batches too).

    Returns:
        (mean loss, {head: mean loss}, skipped batches, graphs/s).
    """
    callbacks = loop.callbacks if loop is not None else ()
    module = strategy.unwrap()
    names = [v.name for v in module.schema.outputs]
    module.train()
    cast(nn.Module, strategy.model).train()  # set up together with the plain model (unwrap() above)
    sums = [0.0] * (len(names) + 1)  # [loss * graphs, head losses * graphs...], on the host
    skipped = 0
    n_batches = len(loader)
    t0 = time.perf_counter()
    graphs = 0
    bar = progress.bar(loader, n_batches, f"epoch {epoch}")
    every = max(1, n_batches // 20)  # the bar's running loss: updated every `every` batches
    try:
        for i, batch in enumerate(bar if bar is not None else loader):
            batch = strategy.to_device(batch)
            for cb in callbacks:
                cb.before_forward(cast("LoopView", loop), i)  # callbacks come from the loop
            out = strategy.forward(batch)
            if loop is not None:
                loop.train_batches += 1
            loss, heads = module.loss(out, batch)
            values = torch.stack([loss.detach(), *(heads[name].detach() for name in names)]).tolist()
            if not _finite(strategy, values[0]):
                head_values = dict(zip(names, values[1:]))
                if nan_policy == "skip":
                    skipped += 1
                    strategy.zero_grad()
                    progress.log(
                        1,
                        f"epoch {epoch} batch {i}/{n_batches}: non-finite loss ({fmt_losses(head_values)}); batch skipped",
                    )
                    continue
                raise TrainingAborted(
                    f"non-finite loss at epoch {epoch}, batch {i} of {n_batches} "
                    f"(loss={values[0]}, per head: {fmt_losses(head_values)}); the weights were not updated "
                    "(set NeuralNetwork.Training.nan_policy to 'skip' to skip such batches)"
                )
            strategy.backward(loss)
            for cb in callbacks:
                cb.before_step(cast("LoopView", loop))
            strategy.step()
            n = int(getattr(batch, "num_graphs", 1))
            for cb in callbacks:
                cb.after_step(cast("LoopView", loop), n, values[0])
            graphs += n
            for j, value in enumerate(values):
                sums[j] += value * n
            if bar is None and not progress.batch_due(i, n_batches):
                continue
            elapsed = max(time.perf_counter() - t0, 1e-9)
            if bar is not None and ((i + 1) % every == 0 or i + 1 == n_batches):
                running = f"loss {sums[0] / graphs:.4g}, {graphs / elapsed:.1f} graphs/s"
                bar.set_postfix_str(running, refresh=i + 1 == n_batches)
            if progress.batch_due(i, n_batches):
                progress.batch(epoch, i, n_batches, values[0], dict(zip(names, values[1:])), graphs / elapsed)
    finally:
        if bar is not None:
            bar.close()
    throughput = graphs * strategy.world_size / max(time.perf_counter() - t0, 1e-9)
    counted = graphs
    if strategy.distributed:
        totals = torch.tensor([*sums, counted], dtype=torch.float64, device=strategy.device)
        *sums, counted = strategy.all_reduce_sum(totals).tolist()
    count = max(float(counted), 1.0)
    return sums[0] / count, {n: sums[1 + j] / count for j, n in enumerate(names)}, skipped, throughput


def _finite(strategy: Strategy, loss: float) -> bool:
    """Whether the loss (read on the host before the backward, so that a bad batch never reaches
    the weights) is finite on every rank: under torch.distributed the ranks agree by an
    all-reduce before any of them enters a collective of the backward."""
    bad = not math.isfinite(loss)
    if strategy.distributed:
        flag = torch.tensor([float(bad)], dtype=torch.float32, device=strategy.device)
        bad = bool(strategy.all_reduce_sum(flag).item())
    return not bad
