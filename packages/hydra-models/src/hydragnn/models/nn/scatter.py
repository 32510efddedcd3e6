"""Scatter / segment reductions shared by encoders, heads and the MLIP wrapper.

Every reduction takes its output size from a Python int (never from tensor values), so none
synchronises with the device; sums over bfloat16 / float16 inputs accumulate in float32, as does
the aggregation of a PyG convolution with the :class:`Float32Aggregation` mixin.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config_names import POOLING_NAMES


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are accumulated in: float32 for 16-bit floats, ``dtype`` otherwise."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class Float32Aggregation:
    """Mixin for a PyG ``MessagePassing``: aggregate 16-bit messages in float32.

    Sums over tens of neighbours in bfloat16 lose most of their digits; the messages are
    upcast before the aggregation and the result is cast back to the message dtype.
    """

    def aggregate(
        self, inputs: torch.Tensor, index: torch.Tensor, ptr: torch.Tensor | None = None, dim_size: int | None = None
    ) -> torch.Tensor:
        acc = accumulate_dtype(inputs.dtype)
        return super().aggregate(inputs.to(acc), index, ptr, dim_size).to(inputs.dtype)  # type: ignore[misc]


def scatter_sum(
    src: torch.Tensor, index: torch.Tensor, dim_size: int, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Sum rows of ``src`` into ``dim_size`` buckets.

    Args:
        src: ``[M, ...]`` values.
        index: ``[M]`` int64 bucket of each row.
        dim_size: number of buckets (a Python int).
        out_dtype: dtype of the result; defaults to ``src.dtype``.

    Returns:
        ``[dim_size, ...]``; accumulated in float32 when ``src`` is 16-bit.
    """
    acc = accumulate_dtype(src.dtype)
    out = src.new_zeros((dim_size, *src.shape[1:]), dtype=acc)
    out = out.index_add(0, index, src.to(acc))
    return out.to(out_dtype or src.dtype)


def scatter_mean(src: torch.Tensor, index: torch.Tensor, dim_size: int) -> torch.Tensor:
    """Mean of the rows of ``src`` per bucket (0 for empty buckets): ``[M, F] -> [dim_size, F]``."""
    acc = accumulate_dtype(src.dtype)
    total = scatter_sum(src, index, dim_size, out_dtype=acc)
    count = scatter_sum(torch.ones_like(index, dtype=acc), index, dim_size).clamp(min=1.0)
    return (total / count.view(-1, *([1] * (src.dim() - 1)))).to(src.dtype)


def scatter_max(src: torch.Tensor, index: torch.Tensor, dim_size: int) -> torch.Tensor:
    """Maximum of the rows of ``src`` per bucket (0 for empty buckets): ``[M, F] -> [dim_size, F]``."""
    out = src.new_zeros((dim_size, *src.shape[1:]))
    idx = index.view(-1, *([1] * (src.dim() - 1))).expand_as(src)
    return out.scatter_reduce(0, idx, src, reduce="amax", include_self=False)


def smooth_count(degree: torch.Tensor) -> torch.Tensor:
    """A smooth, positive stand-in for ``max(degree, 1)``: ``sqrt(1 + degree**2)``."""
    return torch.sqrt(1.0 + degree * degree)


POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "add": scatter_sum,
    "sum": scatter_sum,
    "mean": scatter_mean,
    "max": scatter_max,
}
"""Graph pooling by name (``Architecture.graph_pooling``)."""
assert tuple(POOLINGS) == POOLING_NAMES, "config_names.POOLING_NAMES must name POOLINGS"


def rank_in_group(group: torch.Tensor, key: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Rank ``[M]`` of each item within its ``group`` (ascending ``key``, ties in input order).

    No host synchronisation (sorts and scatters only). ``group`` need not be sorted.
    """
    order = torch.sort(key, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]
    ones = torch.ones_like(group)
    count = torch.zeros(num_groups, dtype=group.dtype, device=group.device).index_add(0, group, ones)
    first = torch.cumsum(count, 0) - count
    sorted_rank = torch.arange(group.shape[0], device=group.device) - first[group[order]]
    return torch.empty_like(group).index_put((order,), sorted_rank)
