"""One training pass over a loader: forward, loss, the non-finite-loss policy, step, running
metrics, progress (the loop of :func:`hydragnn.train.loop.train_validate_test` runs it per epoch).

Running metrics accumulate on the model's device and are read once per epoch (and where progress
output asks for them): the only per-batch host read is the finiteness of the loss, which the
non-finite policy needs before the backward.
"""

from __future__ import annotations

import time

import torch

from .averaging import WeightAverage
from .errors import TrainingAborted
from .progress import Progress, fmt_losses
from .schedule import ProjectionRedraw, Warmup
from .strategies.base import Strategy
from .threads import ThreadTuner


def train_epoch(
    strategy: Strategy,
    loader,
    epoch: int,
    nan_policy: str,
    progress: Progress,
    redraw: ProjectionRedraw | None = None,
    warmup: Warmup | None = None,
    average: WeightAverage | None = None,
    threads: ThreadTuner | None = None,
) -> tuple[float, dict[str, float], int, float]:
    """One pass over ``loader``. Returns (mean loss, {head: mean loss}, skipped batches, graphs/s)."""
    module = strategy.unwrap()
    names = [v.name for v in module.schema.outputs]
    module.train()
    strategy.model.train()
    # [loss * graphs, head losses * graphs..., graphs] on the model's device: read once per epoch
    sums = torch.zeros(len(names) + 2, dtype=torch.float64, device=strategy.device)
    skipped = 0
    n_batches = len(loader)
    t0 = time.perf_counter()
    graphs = 0
    bar = progress.bar(loader, n_batches, f"epoch {epoch}")
    every = max(1, n_batches // 20)  # the bar's running loss: a host read every `every` batches
    if threads is not None:
        threads.new_epoch()
    try:
        for i, batch in enumerate(bar if bar is not None else loader):
            batch = strategy.to_device(batch)
            if redraw is not None:
                redraw.before_forward()
            out = strategy.forward(batch)
            if redraw is not None:
                redraw.after_batch()
            loss, heads = module.loss(out, batch)
            if not _finite(strategy, loss):
                head_values = {k: float(v.detach()) for k, v in heads.items()}
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
                    f"(loss={float(loss.detach())}, per head: {fmt_losses(head_values)}); the weights were not updated "
                    "(set NeuralNetwork.Training.nan_policy to 'skip' to skip such batches)"
                )
            strategy.backward(loss)
            if warmup is not None:
                warmup.before_step()
            strategy.step()
            if warmup is not None:
                warmup.after_step()
            if average is not None:
                average.update(module)
            n = int(getattr(batch, "num_graphs", 1))
            graphs += n
            if threads is not None:
                threads.step_done(n)
            row = torch.stack([loss.detach(), *(heads[name].detach() for name in names)])
            sums[:-1].add_(row.to(torch.float64), alpha=n)
            sums[-1] += n
            if bar is None and not progress.batch_due(i, n_batches):
                continue
            elapsed = max(time.perf_counter() - t0, 1e-9)
            if bar is not None and ((i + 1) % every == 0 or i + 1 == n_batches):
                running = f"loss {float(sums[0]) / float(sums[-1]):.4g}, {graphs / elapsed:.1f} graphs/s"
                bar.set_postfix_str(running, refresh=i + 1 == n_batches)
            if progress.batch_due(i, n_batches):
                values = row.tolist()
                progress.batch(epoch, i, n_batches, values[0], dict(zip(names, values[1:])), graphs / elapsed)
    finally:
        if bar is not None:
            bar.close()
    throughput = graphs * strategy.world_size / max(time.perf_counter() - t0, 1e-9)
    sums = strategy.all_reduce_sum(sums).cpu()
    count = max(float(sums[-1]), 1.0)
    return float(sums[0]) / count, {n: float(sums[1 + j]) / count for j, n in enumerate(names)}, skipped, throughput


def _finite(strategy: Strategy, loss: torch.Tensor) -> bool:
    """Whether the loss is finite on every rank: the one host read per batch, made before the
    backward so that a bad batch never reaches the weights (ranks agree before a collective)."""
    bad = (~torch.isfinite(loss.detach())).to(torch.float32).reshape(1)
    if strategy.distributed:
        bad = strategy.all_reduce_sum(bad)
    return not bool(bad.item())
