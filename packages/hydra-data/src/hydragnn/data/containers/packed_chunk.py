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

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data

from ..errors import ContainerError
from .codec import build_data

__all__ = ["PackedChunk", "Rows", "each_sample"]


@dataclass(frozen=True)
class Rows:
    """A field's values as rows of a small table: ``table[index]`` flattened (``table [T, w]``,
    ``index [R]`` integer). For a field that takes few distinct rows (a periodic cell's image
    offsets: 27 rows per cell, one index per edge), stored in a fraction of the bytes."""

    table: torch.Tensor
    index: torch.Tensor

    def values(self) -> torch.Tensor:
        """The 1-D values ``table[index].reshape(-1)``."""
        return self.table.index_select(0, self.index.long()).reshape(-1)

    def numel(self) -> int:
        return self.index.numel() * (self.table.shape[1] if self.table.dim() == 2 else 0)

    @property
    def nbytes(self) -> int:
        return self.table.numel() * self.table.element_size() + self.index.numel() * self.index.element_size()


@dataclass(frozen=True)
class PackedChunk:
    """``count`` consecutive samples stored field by field.

    ``fields[key] = (data, shapes)``: ``data`` the 1-D concatenation of each sample's flattened
    tensor (one dtype; or :class:`Rows` giving it), ``shapes [count, rank]`` int64 each sample's
    shape. Every sample has every field, in the order of ``fields`` (the attribute order of each
    sample read back).

    Raises:
        ContainerError: a field whose shapes do not cover its data or do not count ``count`` rows.
    """

    count: int
    fields: dict[str, tuple[torch.Tensor | Rows, torch.Tensor]]

    def __post_init__(self) -> None:
        for key, (data, shapes) in self.fields.items():
            if isinstance(data, Rows):
                index, rows = data.index, data.table.shape[0] if data.table.dim() == 2 else 0
                flat = (
                    data.table.dim() == 2
                    and index.dim() == 1
                    and not index.is_floating_point()
                    and (not index.numel() or (int(index.min()) >= 0 and int(index.max()) < rows))
                )
            else:
                flat = data.dim() == 1
            if (
                not flat
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
        return sum(
            data.nbytes if isinstance(data, Rows) else data.numel() * data.element_size()
            for data, _ in self.fields.values()
        )

    def samples(self) -> Iterator[Data]:
        """Each sample as a ``Data`` whose tensors are views into the chunk's tensors."""
        cuts: list[tuple[list[tuple[int, ...]], list[int]]] = []
        for _, shapes in self.fields.values():
            sizes = shapes.tolist()
            ends = [0]
            for shape in sizes:
                ends.append(ends[-1] + math.prod(shape))
            cuts.append(([tuple(s) for s in sizes], ends))
        fields = [(key, data.values() if isinstance(data, Rows) else data) for key, (data, _) in self.fields.items()]
        for j in range(self.count):
            sample: dict[str, Any] = {}
            for (key, data), (sizes, ends) in zip(fields, cuts, strict=True):
                sample[key] = data[ends[j] : ends[j + 1]].view(sizes[j])
            yield build_data(sample)


def each_sample(items: Iterable[Data | PackedChunk]) -> Iterator[Data]:
    """The samples of ``items``, packed chunks taken apart."""
    for item in items:
        if isinstance(item, PackedChunk):
            yield from item.samples()
        else:
            yield item
