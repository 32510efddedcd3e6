"""Cost-aware batching: pack graphs up to a node or edge budget, balanced across ranks.

Configured by ``Training.Batching``: ``{"mode": "node_budget", "max_nodes": 4096, "max_graphs":
64, "oversized_sample": "error", "seed": 0, "drop_last": false}``.

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
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from .errors import DataError, did_you_mean

MODES: dict[str, str] = {"node_budget": "max_nodes", "edge_budget": "max_edges"}
"""Batching mode -> the config key holding its budget."""
OVERSIZED_POLICIES: tuple[str, ...] = ("error", "single", "skip")
_KEYS = ("mode", "max_nodes", "max_edges", "max_graphs", "oversized_sample", "seed", "drop_last")
_WHERE = "Training.Batching"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class BatchingConfig:
    """Validated ``Training.Batching`` section.

    Attributes:
        mode: ``"node_budget"`` (cost of a graph = its node count) or ``"edge_budget"``
            (cost = its edge count, ``edge_index.shape[1]``).
        max_nodes: node budget per batch; required by, and only allowed with, ``node_budget``.
        max_edges: edge budget per batch; required by, and only allowed with, ``edge_budget``.
        max_graphs: cap on graphs per batch, or ``None`` for no cap.
            :func:`hydragnn.data.loaders.create_dataloaders` fills it with ``batch_size`` when
            the section does not set it.
        oversized_sample: what to do with a graph costlier than the budget: ``"error"``,
            ``"single"`` (a batch of its own) or ``"skip"`` (left out).
        seed: base seed of the shuffle; epoch ``e`` uses ``seed + e``.
        drop_last: drop the last ``B mod R`` batches so ranks need no splitting.

    Raises:
        DataError: on construction with invalid values, naming ``Training.Batching.<key>``.
    """

    mode: str
    max_nodes: int | None = None
    max_edges: int | None = None
    max_graphs: int | None = None
    oversized_sample: str = "error"
    seed: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        w = _WHERE
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise DataError(f"{w}.mode: expected one of {list(MODES)}, found {self.mode!r}")
        budget_key = MODES[self.mode]
        for key in ("max_nodes", "max_edges", "max_graphs"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value <= 0):
                raise DataError(f"{w}.{key}: expected an integer > 0, found {value!r}")
        if getattr(self, budget_key) is None:
            raise DataError(f"{w}.{budget_key}: required by mode {self.mode!r} (an integer > 0); missing")
        for mode, key in MODES.items():
            if mode != self.mode and getattr(self, key) is not None:
                raise DataError(
                    f"{w}.{key}: only allowed with mode {mode!r}; mode is {self.mode!r}, whose budget is {budget_key!r}"
                )
        if not isinstance(self.oversized_sample, str) or self.oversized_sample not in OVERSIZED_POLICIES:
            raise DataError(
                f"{w}.oversized_sample: expected one of {list(OVERSIZED_POLICIES)}, found {self.oversized_sample!r}"
            )
        if not _is_int(self.seed) or self.seed < 0:
            raise DataError(f"{w}.seed: expected an integer >= 0, found {self.seed!r}")
        if not isinstance(self.drop_last, bool):
            raise DataError(f"{w}.drop_last: expected true or false, found {self.drop_last!r}")

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> BatchingConfig:
        """Parse the JSON ``Training.Batching`` section.

        Args:
            section: ``{"mode": ..., "max_nodes" | "max_edges": ..., ...}``.

        Raises:
            DataError: on unknown keys, a missing mode or budget, wrong types or non-positive
                values; the message names ``Training.Batching.<key>`` and what was expected.
        """
        if isinstance(section, BatchingConfig):
            return section
        if not isinstance(section, Mapping):
            raise DataError(f"{_WHERE}: expected an object with keys {list(_KEYS)}, found {type(section).__name__}")
        unknown = sorted(set(section) - set(_KEYS))
        if unknown:
            hint = did_you_mean(unknown[:1], _KEYS)
            raise DataError(f"{_WHERE}.{unknown[0]}: unknown key{hint}; allowed keys are {list(_KEYS)}")
        if "mode" not in section:
            raise DataError(f"{_WHERE}.mode: missing; expected one of {list(MODES)}")
        return cls(**dict(section))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, without unset budgets; ``from_dict(c.to_dict()) == c``."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @property
    def budget(self) -> int:
        """The per-batch cost budget of the mode (``max_nodes`` or ``max_edges``)."""
        return int(getattr(self, MODES[self.mode]))


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
        return [int(c) for c in hook(mode)]
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
