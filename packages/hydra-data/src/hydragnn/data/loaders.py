"""``create_dataloaders``: train / validation / test loaders, fixed-size or cost-aware, rank-aware.

Fixed (``batching=None``): ``batch_size`` graphs per batch. Training uses
:class:`torch.utils.data.DistributedSampler` (shuffled from ``seed + epoch``; ``num_replicas=1``
with one process, so the order is deterministic and ``set_epoch`` exists), which pads an epoch
with up to ``world_size - 1`` repeated samples. Validation / test use
:class:`~hydragnn.data.batching.FixedBatchSampler`: dataset order, batches dealt to ranks
round-robin, the largest split when their number does not divide by the world size, so every
sample is evaluated exactly once; only when even single-graph batches cannot balance the ranks
are the first samples repeated (listed in ``loader.batch_sampler.padded``). With one process the
batches are those of ``DataLoader(dataset, batch_size)``.

Cost-aware (``batching`` = a ``Training.Batching`` dict or a
:class:`~hydragnn.data.batching.BatchingConfig`): :class:`~hydragnn.data.batching.CostAwareBatchSampler`
packs graphs up to ``max_nodes`` / ``max_edges``; ``batch_size`` is the default ``max_graphs``
(``None``: no graph cap) and ``seed`` the default seed. Training shuffles; validation / test keep
dataset order and never drop batches; the oversized-sample policy applies to all three sets.

Every loader is a ``torch_geometric.loader.DataLoader`` of PyG ``Batch`` objects, collated by
:func:`~hydragnn.data.collate.collate_graphs` (the same batches, built faster). Call
:func:`set_epoch` at the start of each epoch: the training order depends only on ``(seed, epoch)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch.utils.data import DistributedSampler
from torch_geometric.loader import DataLoader

from .batching import BatchingConfig, CostAwareBatchSampler, FixedBatchSampler, _is_int, sample_costs
from .collate import GraphCollater
from .errors import DataError


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _batching_config(batching: Mapping[str, Any] | BatchingConfig, batch_size: int | None, seed: int) -> BatchingConfig:
    if isinstance(batching, BatchingConfig):
        return batching
    if not isinstance(batching, Mapping):
        raise DataError(f"Training.Batching: expected an object or a BatchingConfig, found {type(batching).__name__}")
    defaults: dict[str, Any] = {"seed": seed}
    if batch_size is not None:
        defaults["max_graphs"] = batch_size
    return BatchingConfig.from_dict({**defaults, **batching})


def _loader(dataset: Any, **kwargs: Any) -> DataLoader:
    """A PyG ``DataLoader`` whose batches :func:`~hydragnn.data.collate.collate_graphs` builds."""
    loader = DataLoader(dataset, **kwargs)
    loader.collate_fn = GraphCollater(dataset)
    return loader


def create_dataloaders(
    trainset: Any,
    valset: Any,
    testset: Any,
    batch_size: int | None,
    *,
    batching: Mapping[str, Any] | BatchingConfig | None = None,
    num_workers: int = 0,
    seed: int = 0,
    pin_memory: bool = False,
) -> tuple[DataLoader | None, DataLoader | None, DataLoader | None]:
    """Build the training, validation and test loaders (see the module docstring).

    Args:
        trainset: map-style dataset of PyG ``Data`` (list, torch ``Dataset``, container).
        valset: same, or ``None`` (then its loader is ``None``).
        testset: same, or ``None``.
        batch_size: graphs per batch (fixed batching), or the default ``max_graphs``
            (cost-aware batching; may then be ``None``).
        batching: ``None`` for fixed batches, else the ``Training.Batching`` section.
        num_workers: worker processes per loader.
        seed: shuffle seed (fixed batching; default seed of cost-aware batching).
        pin_memory: passed to the loaders.

    Returns:
        ``(train_loader, val_loader, test_loader)``; under torch.distributed each yields this
        rank's share, and every rank takes the same number of steps per epoch.

    Raises:
        DataError: on an invalid ``batch_size``, ``seed`` or ``Training.Batching`` section, or an
            oversized sample under policy ``"error"``.
    """
    if not _is_int(seed) or seed < 0:
        raise DataError(f"seed: expected an integer >= 0, found {seed!r}")
    if batch_size is not None and (not _is_int(batch_size) or batch_size <= 0):
        raise DataError(f"batch_size: expected an integer > 0, found {batch_size!r}")
    replicas, rank = _world()
    common: dict[str, Any] = {"num_workers": num_workers, "pin_memory": pin_memory}

    if batching is None:
        if batch_size is None:
            raise DataError("batch_size: required (an integer > 0) when Training.Batching is not set")

        def train_loader(ds: Any) -> DataLoader:
            sampler = DistributedSampler(ds, num_replicas=replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
            return _loader(ds, batch_size=batch_size, sampler=sampler, **common)

        def eval_loader(ds: Any) -> DataLoader:
            sampler = FixedBatchSampler(len(ds), batch_size, num_replicas=replicas, rank=rank)
            return _loader(ds, batch_sampler=sampler, **common)
    else:
        cfg = _batching_config(batching, batch_size, seed)
        eval_cfg = dataclasses.replace(cfg, drop_last=False)

        def train_loader(ds: Any) -> DataLoader:
            sampler = CostAwareBatchSampler(sample_costs(ds, cfg.mode), cfg, True, replicas, rank)
            return _loader(ds, batch_sampler=sampler, **common)

        def eval_loader(ds: Any) -> DataLoader:
            sampler = CostAwareBatchSampler(sample_costs(ds, cfg.mode), eval_cfg, False, replicas, rank)
            return _loader(ds, batch_sampler=sampler, **common)

    return (
        train_loader(trainset) if trainset is not None else None,
        eval_loader(valset) if valset is not None else None,
        eval_loader(testset) if testset is not None else None,
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on the loader's batch sampler or sampler, whichever has it.

    Args:
        loader: a loader from :func:`create_dataloaders` (any ``DataLoader`` is accepted; one
            without an epoch-aware sampler is left alone).
        epoch: the epoch about to start.
    """
    for sampler in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
            return
