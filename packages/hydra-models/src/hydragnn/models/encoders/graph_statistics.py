"""Statistics of the training graphs that encoders read before they are built
(:meth:`~hydragnn.models.encoders.Encoder.data_statistics`): PNA's in-degree histogram and the
mean neighbour count that MACE, EGNN and PAINN divide their neighbour sums by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def degree_histogram(samples: Sequence[Any]) -> list[int]:
    """In-degree histogram of prepared samples: ``hist[k]`` = number of nodes with ``k`` incoming edges."""
    hist = torch.zeros(1, dtype=torch.long)
    for i, data in enumerate(samples):
        edge_index = getattr(data, "edge_index", None)
        if edge_index is None:
            raise ValueError(f"degree_histogram: sample {i} has no edge_index (prepare it with edges first)")
        deg = torch.bincount(edge_index[1], minlength=int(data.num_nodes))
        counts = torch.bincount(deg)
        if counts.numel() > hist.numel():
            hist = torch.cat([hist, hist.new_zeros(counts.numel() - hist.numel())])
        hist[: counts.numel()] += counts
    return hist.tolist()


def mean_in_degree(samples: Sequence[Any]) -> float | None:
    """The samples' mean in-degree (edges per atom, rounded to 6 decimals): ``avg_num_neighbors``.

    ``None`` when there are no samples, they carry no edges, or no node has a neighbour: the
    encoder then keeps its default.
    """
    if not samples or getattr(samples[0], "edge_index", None) is None:
        return None
    hist = degree_histogram(samples)
    nodes = sum(hist)
    mean = sum(k * count for k, count in enumerate(hist)) / nodes if nodes else 0.0
    return round(mean, 6) if mean > 0 else None


def avg_num_neighbors_statistics(unset: bool, samples: Sequence[Any]) -> dict[str, Any]:
    """``{"avg_num_neighbors": mean in-degree}`` when the config leaves the key ``unset`` and the
    samples give a mean, else ``{}`` (the shared ``data_statistics`` of MACE, EGNN and PAINN)."""
    mean = mean_in_degree(samples) if unset else None
    return {} if mean is None else {"avg_num_neighbors": mean}
