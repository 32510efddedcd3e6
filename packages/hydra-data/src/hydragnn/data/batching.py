"""Cost-aware batching: pack graphs up to a node or edge budget, balanced across ranks.

Configured by ``Training.Batching``: ``{"mode": "node_budget", "max_nodes": 4096, "max_graphs":
64, "oversized_sample": "error", "seed": 0, "drop_last": false}``, parsed by
:class:`~hydragnn.data.batching_config.BatchingConfig` (torch-free; re-exported here).

Packing, per epoch: the order is a permutation drawn from ``seed + epoch`` (identity without
shuffling); graphs are packed next-fit in that order, a new batch starting when the budget
(``max_nodes`` / ``max_edges``) or ``max_graphs`` would be exceeded: no batch exceeds the budget.
A graph over the budget on its own follows ``oversized_sample``: ``"error"`` (a
:class:`DataError` when the sampler is built), ``"single"`` (a batch of its own) or ``"skip"``
(listed in :attr:`CostAwareBatchSampler.skipped`).

Ranks: every rank packs the same global batch list and rank ``r`` takes batches ``r, r + R,
...``. When the batch count is not a multiple of ``R``, ``drop_last=False`` (default) splits the
fullest batches into contiguous parts (at most ``R - 1`` extra batches) so every rank takes the
same number of steps and every kept sample is seen once; only with too few graphs to split are
single-sample batches repeated from the start of the epoch (listed in :attr:`padded`), as
:class:`DistributedSampler` does. ``drop_last=True`` drops the last ``B mod R`` batches. All
ranks must build the sampler from the same sizes and configuration.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from .batching_config import _WHERE, MODES, OVERSIZED_POLICIES, BatchingConfig  # noqa: F401  (re-exported)
from .errors import DataError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sample_costs(dataset: Any, mode: str) -> list[int]:
    """Per-sample cost of ``dataset`` for a batching mode.

    A dataset may provide the costs itself (without loading samples) through a method
    ``dataset.sample_costs(mode) -> Sequence[int]``; otherwise every sample is read once.

    Args:
        dataset: a map-style dataset of PyG ``Data``.
        mode: ``"node_budget"`` (``num_nodes``) or ``"edge_budget"`` (``edge_index.shape[1]``).

    Returns:
        One integer cost per sample, in dataset order.

    Raises:
        DataError: for an unknown mode, or a sample without a node count / ``edge_index``.
    """
    if mode not in MODES:
        raise DataError(f"{_WHERE}.mode: expected one of {list(MODES)}, found {mode!r}")
    hook = getattr(dataset, "sample_costs", None)
    if callable(hook):
        return [int(c) for c in cast(Sequence[int], hook(mode))]
    costs: list[int] = []
    for i in range(len(dataset)):
        data = dataset[i]
        if mode == "node_budget":
            n = getattr(data, "num_nodes", None)
            if n is None:
                raise DataError(
                    f"sample {i}: node_budget batching needs a node count (x, pos or num_nodes); none found"
                )
            costs.append(int(n))
        else:
            edge_index = getattr(data, "edge_index", None)
            if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2:
                raise DataError(
                    f"sample {i}: edge_budget batching needs 'edge_index' of shape (2, E); "
                    f"found {'nothing' if edge_index is None else type(edge_index).__name__}"
                )
            costs.append(int(edge_index.shape[1]))
    return costs


def _split(batch: list[int], parts: int) -> list[list[int]]:
    """``batch`` cut into ``parts`` contiguous pieces whose lengths differ by at most one."""
    if parts == 1:
        return [batch]
    q, r = divmod(len(batch), parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + q + (k < r))
    return [batch[bounds[k] : bounds[k + 1]] for k in range(parts)]


def _replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    initialised = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if not _is_int(num_replicas) or num_replicas < 1:
        raise DataError(f"num_replicas: expected an integer >= 1, found {num_replicas!r}")
    if not _is_int(rank) or not 0 <= rank < num_replicas:
        raise DataError(f"rank: expected an integer in [0, {num_replicas}), found {rank!r}")
    return num_replicas, rank


class _RankBalancedBatchSampler(Sampler[list[int]]):
    """Deals a global list of batches to ranks so that every rank takes the same number of steps."""

    def __init__(self, shuffle: bool, seed: int, drop_last: bool, num_replicas: int | None, rank: int | None):
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.num_replicas, self.rank = _replicas(num_replicas, rank)
        self.epoch = 0
        self.padded: list[int] = []
        """Indices repeated in the current epoch to give every rank a batch (rarely non-empty)."""
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration uses (deterministic per seed and epoch)."""
        self.epoch = int(epoch)

    def _order(self, n: int) -> list[int]:
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def _global_batches(self) -> tuple[list[list[int]], list[int]]:
        """The packed batches of the current epoch and the epoch order of kept samples."""
        raise NotImplementedError

    def _balanced(self) -> list[list[int]]:
        batches, order = self._global_batches()
        replicas = self.num_replicas
        self.padded = []
        rem = len(batches) % replicas
        if rem == 0:
            return batches
        if self.drop_last:
            return batches[: len(batches) - rem]
        need = replicas - rem
        # Split the batches with the most graphs: batch j ends up in pieces[j] near-equal parts.
        pieces = [1] * len(batches)
        heap = [(-len(b), j) for j, b in enumerate(batches)]
        heapq.heapify(heap)
        while need and heap and -heap[0][0] >= 2:
            _, j = heapq.heappop(heap)
            pieces[j] += 1
            need -= 1
            heapq.heappush(heap, (-math.ceil(len(batches[j]) / pieces[j]), j))
        if any(p > 1 for p in pieces):
            batches = [part for b, p in zip(batches, pieces, strict=True) for part in _split(b, p)]
        self.padded = [order[i % len(order)] for i in range(need)]
        batches.extend([i] for i in self.padded)
        return batches

    def _plan(self) -> list[list[int]]:
        if self._cache is None or self._cache[0] != self.epoch:
            batches = self._balanced()
            self._cache = (self.epoch, batches[self.rank :: self.num_replicas])
        return self._cache[1]

    def __iter__(self) -> Iterator[list[int]]:
        yield from (list(b) for b in self._plan())

    def __len__(self) -> int:
        """Number of batches this rank yields in the current epoch."""
        return len(self._plan())


class CostAwareBatchSampler(_RankBalancedBatchSampler):
    """Batch sampler packing graphs up to a node/edge budget, rank-aware.

    Pass it as ``batch_sampler`` to a ``torch_geometric.loader.DataLoader``. See the module
    docstring for packing and rank balancing.

    Args:
        sizes: cost of each sample (node or edge count, per ``cfg.mode``), a sequence or 1-D
            tensor of non-negative integers; see :func:`sample_costs`.
        cfg: the batching configuration (a :class:`BatchingConfig` or its dict form).
        shuffle: draw a new order each epoch (training); otherwise dataset order.
        num_replicas: number of ranks; default: the world size when torch.distributed is
            initialised, else 1.
        rank: this rank; default: the global rank when initialised, else 0.

    Attributes:
        skipped: sorted indices of oversized samples left out (policy ``"skip"``).
        oversized: sorted indices of all samples costlier than the budget.
        padded: indices repeated in the current epoch to balance ranks (see module docstring).

    Raises:
        DataError: for invalid sizes, or an oversized sample under policy ``"error"`` (naming
            the sample index, its cost and the budget).
    """

    def __init__(
        self,
        sizes: Sequence[int] | torch.Tensor,
        cfg: BatchingConfig | Mapping[str, Any],
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
    ):
        self.cfg = BatchingConfig.from_dict(cfg)
        super().__init__(shuffle, self.cfg.seed, self.cfg.drop_last, num_replicas, rank)
        t = torch.as_tensor(sizes)
        if t.dim() == 1 and t.numel() == 0:
            t = t.to(torch.long)  # an empty list arrives as float
        if t.dim() != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise DataError(f"sizes: expected a 1-D sequence of integers, found shape {tuple(t.shape)} {t.dtype}")
        if t.numel() and int(t.min()) < 0:
            raise DataError(f"sizes: sample {int(t.argmin())} has a negative cost {int(t.min())}")
        self.sizes: list[int] = t.tolist()
        budget, unit = self.cfg.budget, "nodes" if self.cfg.mode == "node_budget" else "edges"
        self.oversized = [i for i, c in enumerate(self.sizes) if c > budget]
        if self.oversized and self.cfg.oversized_sample == "error":
            i = self.oversized[0]
            raise DataError(
                f"sample {i} has {self.sizes[i]} {unit}, over the budget "
                f"{_WHERE}.{MODES[self.cfg.mode]}={budget} ({len(self.oversized)} sample(s) oversized); "
                "raise the budget or set oversized_sample to 'single' or 'skip'"
            )
        self.skipped = list(self.oversized) if self.cfg.oversized_sample == "skip" else []
        self._skip = set(self.skipped)

    def _global_batches(self) -> tuple[list[list[int]], list[int]]:
        budget = self.cfg.budget
        max_graphs = self.cfg.max_graphs or math.inf
        sizes = self.sizes
        order = [i for i in self._order(len(sizes)) if i not in self._skip] if self._skip else self._order(len(sizes))
        batches: list[list[int]] = []
        current: list[int] = []
        cost = 0
        for i in order:
            c = sizes[i]
            if c > budget:  # policy "single": a batch of its own, the open batch stays open
                batches.append([i])
                continue
            if current and (cost + c > budget or len(current) >= max_graphs):
                batches.append(current)
                current, cost = [], 0
            current.append(i)
            cost += c
        if current:
            batches.append(current)
        return batches, order


class FixedBatchSampler(_RankBalancedBatchSampler):
    """Batches of at most ``batch_size`` consecutive samples, same step count on every rank.

    Used for validation and test: no sample is repeated to even out ranks (unlike
    :class:`torch.utils.data.DistributedSampler`); instead the largest batches are split (see the
    module docstring). With one process and ``shuffle=False`` it yields exactly the batches of
    ``DataLoader(dataset, batch_size)``.

    Args:
        num_samples: dataset length.
        batch_size: most samples per batch (> 0).
        shuffle: draw a new order each epoch from ``seed + epoch``.
        seed: base seed of the shuffle.
        drop_last: drop the last ``B mod R`` batches instead of splitting.
        num_replicas: number of ranks (default from torch.distributed, else 1).
        rank: this rank (default from torch.distributed, else 0).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
    ):
        if not _is_int(batch_size) or batch_size <= 0:
            raise DataError(f"batch_size: expected an integer > 0, found {batch_size!r}")
        if not _is_int(num_samples) or num_samples < 0:
            raise DataError(f"num_samples: expected an integer >= 0, found {num_samples!r}")
        super().__init__(shuffle, seed, drop_last, num_replicas, rank)
        self.num_samples = num_samples
        self.batch_size = batch_size

    def _global_batches(self) -> tuple[list[list[int]], list[int]]:
        order = self._order(self.num_samples)
        bs = self.batch_size
        return [order[i : i + bs] for i in range(0, len(order), bs)], order
