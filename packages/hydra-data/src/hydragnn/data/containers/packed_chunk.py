"""Many samples handed to a container field by field, without a ``Data`` per sample.

A builder of many samples at once (the conversion of a file, :mod:`hydragnn.data.io.conversion_samples`)
yields :class:`PackedChunk` objects among the samples given to
:func:`~hydragnn.data.containers.write_dataset`. The ``.pt`` directory writes one as a chunk file
as it is (its on-disk chunk layout is this one); the other formats take its samples one by one
(:func:`each_sample`). Either way the dataset read back is the one the samples would have given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch_geometric.data import Data

from ..errors import ContainerError
from .codec import build_data

__all__ = ["PackedChunk", "each_sample"]


@dataclass(frozen=True)
class PackedChunk:
    """``count`` consecutive samples stored field by field.

    ``fields[key] = (data, shapes)``: ``data`` the 1-D concatenation of each sample's flattened
    tensor (one dtype), ``shapes [count, rank]`` int64 each sample's shape. Every sample has every
    field, in the order of ``fields`` (the attribute order of each sample read back).

    Raises:
        ContainerError: a field whose shapes do not cover its data or do not count ``count`` rows.
    """

    count: int
    fields: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def __post_init__(self) -> None:
        for key, (data, shapes) in self.fields.items():
            if (
                data.dim() != 1
                or shapes.dtype != torch.int64
                or shapes.dim() != 2
                or shapes.shape[0] != self.count
                or int(shapes.prod(dim=1).sum()) != data.numel()
            ):
                raise ContainerError(
                    f"packed chunk: field {key!r} is not {self.count} samples' tensors laid end to end"
                )

    @property
    def nbytes(self) -> int:
        return sum(data.numel() * data.element_size() for data, _ in self.fields.values())

    def samples(self) -> Iterator[Data]:
        """Each sample as a ``Data`` whose tensors are views into the chunk's tensors."""
        cuts: list[tuple[list[tuple[int, ...]], list[int]]] = []
        for _, shapes in self.fields.values():
            sizes = shapes.tolist()
            ends = [0]
            for shape in sizes:
                ends.append(ends[-1] + math.prod(shape))
            cuts.append(([tuple(s) for s in sizes], ends))
        fields = list(self.fields.items())
        for j in range(self.count):
            sample: dict[str, Any] = {}
            for (key, (data, _)), (sizes, ends) in zip(fields, cuts, strict=True):
                sample[key] = data[ends[j] : ends[j + 1]].view(sizes[j])
            yield build_data(sample)


def each_sample(items: Iterable[Data | PackedChunk]) -> Iterator[Data]:
    """The samples of ``items``, packed chunks taken apart."""
    for item in items:
        if isinstance(item, PackedChunk):
            yield from item.samples()
        else:
            yield item
