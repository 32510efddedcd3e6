"""The base class shared by every dataset container, and its JSON header.

Each container stores, next to its samples, one JSON *header*::

    {"format": "pickle" | "pt" | "adios", "version": <int>, "n_samples": <int>,
     "schema": <Schema.to_dict()> | null, "normalization": {...} | null,
     "metadata": {...} | null, "writer": "hydra-data <version>"}

A reader accepts every format version up to its own :attr:`ContainerDataset.VERSION` and refuses
a newer one with a message naming the version.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

from torch.utils.data import Dataset
from torch_geometric.data import Data

from ..__about__ import __version__
from ..errors import ContainerError, SchemaError
from ..schema import Schema

if TYPE_CHECKING:
    from .packed_chunk import PackedChunk


def make_header(
    format_name: str,
    version: int,
    schema: Schema | None,
    normalization: dict[str, Any] | None,
    metadata: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON header of a dataset about to be written (without ``n_samples``).

    Raises:
        ContainerError: when ``schema`` is not a Schema or ``normalization`` / ``metadata`` are not
            JSON-serializable dicts.
    """
    if schema is not None and not isinstance(schema, Schema):
        raise ContainerError(f"schema must be a hydragnn.data.Schema or None, found {type(schema).__name__}")
    for label, value in (("normalization", normalization), ("metadata", metadata)):
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ContainerError(f"{label} must be a JSON-serializable dict or None, found {type(value).__name__}")
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise ContainerError(
                f"{label} must be JSON-serializable (plain numbers, strings, lists, dicts): {exc}"
            ) from None
    return {
        "format": format_name,
        "version": version,
        "n_samples": 0,
        "schema": schema.to_dict() if schema is not None else None,
        "normalization": normalization,
        "metadata": metadata,
        "writer": f"hydra-data {__version__}",
    }


def header_bytes(header: dict[str, Any]) -> bytes:
    """UTF-8 JSON of a header."""
    return json.dumps(header, allow_nan=True, separators=(",", ":")).encode()


def parse_header_bytes(raw: bytes | str, where: str) -> dict[str, Any]:
    """Decode a header's JSON text; ContainerError naming ``where`` on garbage."""
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ContainerError(f"{where}: dataset header is not valid JSON ({exc}); the file is corrupted") from None
    if not isinstance(header, dict):
        raise ContainerError(f"{where}: dataset header must be a JSON object, found {type(header).__name__}")
    return header


def check_version(found: Any, supported: int, format_name: str, where: str) -> int:
    """Validate a stored format version against the newest one this reader supports."""
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        raise ContainerError(f"{where}: invalid {format_name} container format version {found!r}")
    if found > supported:
        raise ContainerError(
            f"{where}: {format_name} container format version {found} is newer than the newest this "
            f"hydra-data ({__version__}) reads, version {supported}; upgrade hydra-data to read it"
        )
    return found


class ContainerDataset(Dataset):
    """A read-only, random-access dataset of PyG ``Data`` stored in a container.

    Loading is authoritative: ``ds[i]`` holds exactly the attributes that were written, nothing is
    rebuilt. Subclasses implement :meth:`detect`, :meth:`write`, :meth:`_open` and :meth:`_read`.

    Attributes:
        path: location of the dataset on disk.
    """

    FORMAT: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    validate: bool = False
    """Check every sample read with :func:`hydragnn.data.validation.check_sample` (``open_dataset(validate=True)``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._n = 0
        self._schema: Schema | None = None
        self._normalization: dict[str, Any] | None = None
        self._metadata: dict[str, Any] | None = None
        if not self.path.exists():
            raise ContainerError(f"{self.path}: no such file or directory")
        try:
            self._open()
        except ContainerError:
            raise
        except Exception as exc:
            raise ContainerError(
                f"{self.path}: cannot open {self.FORMAT} dataset ({type(exc).__name__}: {exc})"
            ) from exc

    # -- for subclasses -----------------------------------------------------------------------

    @classmethod
    def detect(cls, path: Path) -> bool:
        """Whether ``path`` carries this format's on-disk marker (cheap; reads a few bytes)."""
        raise NotImplementedError

    @classmethod
    def detect_own(cls, path: Path) -> bool:
        """Whether ``path`` is a dataset written by this package (safe for ``write_dataset`` to replace)."""
        return cls.detect(path)

    @classmethod
    def write(cls, path: Path, samples: Iterable[Data | PackedChunk], header: dict[str, Any]) -> int:
        """Write a new dataset at ``path`` (which does not exist); returns the sample count.

        Args:
            path: destination; the caller makes the write atomic.
            samples: PyG ``Data`` objects and packed chunks of them.
            header: from :func:`make_header`; ``n_samples`` is filled in by the writer.
        """
        raise NotImplementedError

    def _open(self) -> None:
        """Read and validate the header and index; call :meth:`_set_header`."""
        raise NotImplementedError

    def _read(self, index: int) -> Data:
        """Sample ``index`` (already range-checked, non-negative)."""
        raise NotImplementedError

    def _set_header(self, header: dict[str, Any]) -> None:
        """Validate a decoded header and keep its content."""
        where = str(self.path)
        if header.get("format") != self.FORMAT:
            raise ContainerError(
                f"{where}: expected a {self.FORMAT!r} dataset header, found format {header.get('format')!r}"
            )
        check_version(header.get("version"), self.VERSION, self.FORMAT, where)
        n = header.get("n_samples")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ContainerError(f"{where}: invalid sample count {n!r} in the dataset header")
        schema = header.get("schema")
        try:
            self._schema = Schema.from_dict(schema) if schema is not None else None
        except SchemaError as exc:
            raise ContainerError(f"{where}: stored schema is invalid: {exc}") from None
        for key in ("normalization", "metadata"):
            if header.get(key) is not None and not isinstance(header[key], dict):
                raise ContainerError(f"{where}: stored {key} must be an object, found {type(header[key]).__name__}")
        self._n = n
        self._normalization = header.get("normalization")
        self._metadata = header.get("metadata")

    # -- public API ---------------------------------------------------------------------------

    @property
    def schema(self) -> Schema | None:
        """The ``Variables`` schema stored with the data, if any."""
        return self._schema

    @property
    def normalization(self) -> dict[str, Any] | None:
        """Normalization statistics stored with the data, if any."""
        return self._normalization

    @property
    def metadata(self) -> dict[str, Any] | None:
        """Free-form metadata stored with the data, if any."""
        return self._metadata

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> Data:
        """Sample ``index`` (negative indices count from the end).

        Raises:
            IndexError: when ``index`` is out of range.
            ContainerError: when the stored sample is missing or corrupted.
        """
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self.path}: index {index} is out of range for a dataset of {n} samples")
        try:
            sample = self._read(i)
        except ContainerError:
            raise
        except Exception as exc:
            raise ContainerError(f"{self.path}: sample {i} cannot be read ({type(exc).__name__}: {exc})") from exc
        if self.validate:
            from ..validation import check_sample

            check_sample(sample, self._schema, f"{self.path}: sample {i}")
        return sample

    def close(self) -> None:
        """Release open file handles (reopened on the next access)."""

    def __enter__(self) -> ContainerDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, n_samples={self._n})"
