"""Dataset containers: pickle file, directory of ``.pt`` files, ADIOS2 ``.bp``.

Every container writes atomically, reads one sample without reading the others, round-trips every
tensor bit-exactly, and loads authoritatively (nothing is rebuilt). A missing, truncated or
corrupted dataset raises :class:`~hydragnn.data.ContainerError` naming the path (and sample).

Example::

    from hydragnn.data.containers import write_dataset, open_dataset

    write_dataset("train.bp", samples, "adios", schema=schema, normalization=stats)
    ds = open_dataset("train.bp")
    ds[0], len(ds), ds.schema, ds.normalization
"""

from .adios_container import AdiosDataset
from .api import FORMATS, REGISTRY, detect_format, open_dataset, write_dataset
from .base import ContainerDataset
from .packed_chunk import PackedChunk
from .pickle_container import PickleDataset
from .pt_directory import PtDirectoryDataset

__all__ = [
    "FORMATS",
    "REGISTRY",
    "AdiosDataset",
    "ContainerDataset",
    "PackedChunk",
    "PickleDataset",
    "PtDirectoryDataset",
    "detect_format",
    "open_dataset",
    "write_dataset",
]
