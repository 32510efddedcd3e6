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

Every loader is a :class:`GraphLoader` (a ``torch_geometric.loader.DataLoader``) of PyG ``Batch``
objects, collated by :func:`~hydragnn.data.collate.collate_graphs` (the same batches, built
faster) or, for in-memory lists, cut out of the graphs packed once
(:class:`~hydragnn.data.packed.PackedGraphs`, several batches per cut), optionally ``prefetch`` batches ahead by a
background thread. Call
:func:`set_epoch` at the start of each epoch: the training order depends only on ``(seed, epoch)``.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch.distributed as dist
from torch.utils.data import DistributedSampler
from torch_geometric.loader import DataLoader

from .batching import CostAwareBatchSampler, FixedBatchSampler, _is_int, sample_costs
from .batching_config import BatchingConfig
from .collate import GraphCollater
from .errors import DataError
from .packed import PackedGraphs


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


class GraphLoader(DataLoader):
    """A PyG ``DataLoader`` whose batches :func:`~hydragnn.data.collate.collate_graphs` builds.

    An in-memory list of prepared graphs (without worker processes) is packed once
    (:class:`~hydragnn.data.packed.PackedGraphs`): its batches are cut out of the packed tensors,
    equal to the collated ones, and a batch whose graphs were replaced or modified in place since
    is collated from the list. With ``prefetch > 0`` and no worker processes, a background thread
    builds up to ``prefetch`` batches ahead while the caller computes (torch releases the GIL in
    its kernels). Batches and their order are those of the plain loader; an error in the thread
    is raised in the caller at the batch where it happened."""

    def __init__(self, dataset: Any, *, prefetch: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.collate_fn = GraphCollater(dataset)
        self.prefetch = prefetch
        packable = self.num_workers == 0 and not self.pin_memory and self.batch_sampler is not None
        self.packed = PackedGraphs.build(dataset) if packable else None

    def __iter__(self) -> Iterator[Any]:  # pyright: ignore[reportIncompatibleMethodOverride]  (torch's iterator class is private)
        batches = self._packed_batches(self.packed) if self.packed is not None else super().__iter__()
        if self.prefetch <= 0 or self.num_workers > 0:
            return batches
        return _ahead(batches, self.prefetch)

    def _packed_batches(self, packed: PackedGraphs) -> Iterator[Any]:
        """The sampler's batches, cut out of the packed graphs a chunk of batches at a time; a
        batch whose graphs changed since packing (checked when it is yielded) is collated from
        the list instead."""
        dataset = cast(Sequence[Any], self.dataset)  # packed: a list or tuple of graphs
        selections = cast(Iterable[Sequence[int]], self.batch_sampler)  # packed only with a batch sampler
        for chunk in packed.chunks(selections):
            for indices, batch in zip(chunk, packed.batches(chunk)):
                if packed.current(dataset, indices):
                    yield batch
                else:
                    yield self.collate_fn([dataset[i] for i in indices])


_END = object()


def _ahead(batches: Iterator[Any], depth: int) -> Iterator[Any]:
    """Yield ``batches``, produced by a daemon thread at most ``depth`` items ahead."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        items.put((batch, None), timeout=0.05)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((_END, None))
        except BaseException as exc:  # noqa: BLE001  (re-raised in the consumer)
            items.put((_END, exc))

    thread = threading.Thread(target=produce, name="hydragnn-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            batch, error = items.get()
            if error is not None:
                raise error
            if batch is _END:
                return
            yield batch
    finally:
        stop.set()
        while thread.is_alive():
            try:
                items.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()


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
    prefetch: int = 0,
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
        prefetch: batches a background thread collates ahead (0: none; only without workers).
            Off by default: on CPU with small graphs the thread's Python work competes with the
            model's for the GIL and cost 4-30% of throughput. Meant for a model on a GPU, where
            the kernels release the GIL while collation runs; not measured there yet.

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
            return GraphLoader(ds, prefetch=prefetch, batch_size=batch_size, sampler=sampler, **common)

        def eval_loader(ds: Any) -> DataLoader:
            sampler = FixedBatchSampler(len(ds), batch_size, num_replicas=replicas, rank=rank)
            return GraphLoader(ds, prefetch=prefetch, batch_sampler=sampler, **common)
    else:
        cfg = _batching_config(batching, batch_size, seed)
        eval_cfg = dataclasses.replace(cfg, drop_last=False)

        def train_loader(ds: Any) -> DataLoader:
            sampler = CostAwareBatchSampler(sample_costs(ds, cfg.mode), cfg, True, replicas, rank)
            return GraphLoader(ds, prefetch=prefetch, batch_sampler=sampler, **common)

        def eval_loader(ds: Any) -> DataLoader:
            sampler = CostAwareBatchSampler(sample_costs(ds, cfg.mode), eval_cfg, False, replicas, rank)
            return GraphLoader(ds, prefetch=prefetch, batch_sampler=sampler, **common)

    return (
        train_loader(trainset) if trainset is not None else None,
        eval_loader(valset) if valset is not None else None,
        eval_loader(testset) if testset is not None else None,
    )


class _EpochAware(Protocol):
    """A sampler whose order depends on the epoch."""

    def set_epoch(self, epoch: int) -> None: ...


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on the loader's batch sampler or sampler, whichever has it.

    Args:
        loader: a loader from :func:`create_dataloaders` (any ``DataLoader`` is accepted; one
            without an epoch-aware sampler is left alone).
        epoch: the epoch about to start.
    """
    for sampler in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if hasattr(sampler, "set_epoch"):
            cast(_EpochAware, sampler).set_epoch(epoch)
            return
