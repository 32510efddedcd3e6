"""``write_dataset`` and ``open_dataset``: one entry point for every container format."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

from torch_geometric.data import Data

from ..errors import ContainerError
from ..schema import Schema
from .adios_container import AdiosDataset
from .base import ContainerDataset, make_header
from .packed_chunk import PackedChunk
from .pickle_container import PickleDataset
from .pt_directory import PtDirectoryDataset

REGISTRY: dict[str, type[ContainerDataset]] = {
    PickleDataset.FORMAT: PickleDataset,
    PtDirectoryDataset.FORMAT: PtDirectoryDataset,
    AdiosDataset.FORMAT: AdiosDataset,
}
"""Format name -> dataset class; :func:`open_dataset` asks each class to ``detect`` a path."""

FORMATS: tuple[str, ...] = tuple(REGISTRY)
"""Names accepted by :func:`write_dataset`: ``("pickle", "pt", "adios")``."""


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def detect_format(path: str | Path) -> str | None:
    """The format name of the dataset at ``path``, or ``None`` when no format recognizes it."""
    path = Path(path)
    for name, cls in REGISTRY.items():
        try:
            if cls.detect(path):
                return name
        except OSError:
            continue
    return None


def _owned(cls: type[ContainerDataset], path: Path) -> bool:
    try:
        return cls.detect_own(path)
    except OSError:
        return False


def _replace(tmp: Path, path: Path) -> None:
    """Move ``tmp`` onto ``path``; an existing dataset there is replaced only once ``tmp`` is complete."""
    if not path.exists() and not path.is_symlink():
        os.replace(tmp, path)
        return
    if tmp.is_file() and path.is_file():
        os.replace(tmp, path)  # atomic for files
        return
    old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    _remove(old)


def write_dataset(
    path: str | Path,
    samples: Iterable[Data | PackedChunk],
    format: str,
    *,
    schema: Schema | None = None,
    normalization: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``samples`` to a dataset container at ``path``, atomically.

    The dataset is written into a temporary path beside ``path`` and moved into place only when it
    is complete, so a failure (including one raised by ``samples``) never leaves a half-written
    dataset at ``path``; an existing dataset there is replaced on success.

    Args:
        path: destination file (``"pickle"``) or directory (``"pt"``, ``"adios"``).
        samples: PyG ``Data`` objects, prepared or not; their tensors are stored detached and
            bit-exact, other attributes as JSON values. A :class:`~.packed_chunk.PackedChunk`
            among them stands for its samples.
        format: one of :data:`FORMATS`.
        schema: the ``Variables`` schema to store with the data.
        normalization: JSON-serializable normalization statistics.
        metadata: JSON-serializable free-form metadata.

    Returns:
        ``path`` as a ``pathlib.Path``.

    Raises:
        ContainerError: unknown format, unstorable attribute (naming the sample and key),
            non-JSON normalization / metadata, or ``path`` exists and is not a dataset.
    """
    cls = REGISTRY.get(format)
    if cls is None:
        raise ContainerError(f"unknown dataset format {format!r}; expected one of {list(FORMATS)}")
    path = Path(path)
    header = make_header(cls.FORMAT, cls.VERSION, schema, normalization, metadata)
    if (path.exists() or path.is_symlink()) and not any(_owned(c, path) for c in REGISTRY.values()):
        raise ContainerError(f"{path}: exists and is not a dataset written by hydra-data; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        cls.write(tmp, samples, header)
        _replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return path


def open_dataset(path: str | Path, *, validate: bool = False) -> ContainerDataset:
    """Open the dataset at ``path``, detecting its format from its on-disk marker.

    Args:
        path: a pickle container file, a ``.pt`` directory or an ADIOS2 ``.bp`` directory.
        validate: check every sample read (species, finite positions and cell; a
            ``StructureError`` names the sample), as hydra-train does for stored datasets.

    Returns:
        A :class:`ContainerDataset` (a torch ``Dataset`` of PyG ``Data``).

    Raises:
        ContainerError: the path does not exist, is not a dataset, or the dataset is unreadable.
    """
    path = Path(path)
    if not path.exists():
        raise ContainerError(f"{path}: no such file or directory")
    name = detect_format(path)
    if name is None:
        kinds = "a pickle container file, a directory of .pt files, or an ADIOS2 .bp directory"
        raise ContainerError(f"{path}: not a HydraGNN dataset; expected {kinds}")
    dataset = REGISTRY[name](path)
    dataset.validate = validate
    return dataset
