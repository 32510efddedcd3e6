"""ADIOS2 container internals: dtype mapping, integrity record, and the chunked column writer.

See :mod:`.adios_container` for the on-disk layout. ``adios2`` is imported lazily by
:func:`import_adios2`, so this module imports without it.
"""

from __future__ import annotations

import os
import zlib
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ContainerError
from .base import check_version, header_bytes, parse_header_bytes
from .codec import DTYPES, JSON_KIND, dtype_name, sample_fields

INTEGRITY = "hydragnn-integrity.json"
_IGNORED = {INTEGRITY, "profiling.json"}
ATTRIBUTE = "hydragnn"
ATTRIBUTE_CRC = "hydragnn-crc32"
"""CRC of the header attribute's text (absent in files of older writers)."""
_CHUNK_BYTES = 32 << 20
_NATIVE = {
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
}
_BY_ITEMSIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def import_adios2() -> Any:
    """The ``adios2`` module; ContainerError with the install command when it is missing."""
    try:
        import adios2
    except ImportError:
        raise ContainerError("ADIOS2 datasets need the adios2 package: pip install hydra-data[adios]") from None
    return adios2


def storage_dtype(name: str) -> str:
    """Name of the dtype a tensor dtype ``name`` is stored as (``"json"`` -> uint8)."""
    if name == JSON_KIND:
        return "uint8"
    return name if name in _NATIVE else _BY_ITEMSIZE[DTYPES[name].itemsize]


def _column(value: torch.Tensor | str) -> np.ndarray:
    """Flat numpy view of a compact tensor (or UTF-8 bytes of JSON text) in its storage dtype."""
    if isinstance(value, str):
        return np.frombuffer(value.encode(), dtype=np.uint8)
    storage = DTYPES[storage_dtype(dtype_name(value.dtype))]
    return value.reshape(-1).view(storage).numpy()


def integrity_record(path: Path) -> dict[str, dict[str, Any]]:
    """``{file name: {"size", "crc32"}}`` of a written ``.bp`` directory (no CRC for data files)."""
    files: dict[str, dict[str, Any]] = {}
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name in _IGNORED or not entry.is_file():
            continue
        size = entry.stat().st_size
        crc = None if entry.name.startswith("data.") else zlib.crc32(Path(entry.path).read_bytes())
        files[entry.name] = {"size": size, "crc32": crc}
    return files


def check_integrity(path: Path, version: int) -> dict[str, Any]:
    """Compare a ``.bp`` directory with its integrity record before ADIOS2 opens it; return the record.

    Raises:
        ContainerError: the record is missing or newer than ``version``, or a file is missing,
            has another size, or (metadata files) another CRC.
    """
    where = str(path)
    marker = path / INTEGRITY
    if not marker.is_file():
        raise ContainerError(
            f"{where}: not a HydraGNN ADIOS2 dataset (no {INTEGRITY}); incomplete or foreign .bp directory"
        )
    record = parse_header_bytes(marker.read_bytes(), str(marker))
    check_version(record.get("version"), version, "adios integrity file", str(marker))
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        raise ContainerError(f"{marker}: integrity record lists no files; the dataset is corrupted")
    for name, expected in files.items():
        file = path / name
        if not isinstance(expected, dict) or not file.is_file():
            raise ContainerError(f"{where}: ADIOS2 file {name!r} is missing; the dataset is incomplete")
        size = file.stat().st_size
        if size != expected.get("size"):
            raise ContainerError(
                f"{where}: ADIOS2 file {name!r} is {size} bytes, expected {expected.get('size')}: truncated or corrupted"
            )
        if expected.get("crc32") is not None and zlib.crc32(file.read_bytes()) != expected["crc32"]:
            raise ContainerError(f"{where}: ADIOS2 file {name!r} is corrupted (checksum mismatch)")
    return record


class ColumnWriter:
    """Appends the columns of samples to growing ADIOS2 global arrays, one chunk at a time."""

    def __init__(self, adios2: Any, path: Path) -> None:
        self.path = path
        self.adios = adios2.Adios()
        self.io = self.adios.declare_io("hydragnn-adios-write")
        self.io.set_engine("BP5")
        self.io.set_parameters({"Profile": "Off"})
        self.stream: Any = adios2.Stream(self.io, str(path), "w")  # None once closed
        self.keys: list[dict[str, Any]] | None = None
        self.crcs = array("I")  # compact: one entry per sample and key
        self.n = 0

    def _start(self, fields: dict[str, torch.Tensor | str]) -> list[dict[str, Any]]:
        self.keys = keys = [
            {
                "name": k,
                "dtype": JSON_KIND if isinstance(v, str) else dtype_name(v.dtype),
                "ndim": 0 if isinstance(v, str) else v.dim(),
            }
            for k, v in fields.items()
        ]
        k = len(self.keys)
        self.pending: list[list[np.ndarray]] = [[] for _ in range(k)]
        self.pending_bytes = 0
        self.offsets = [array("q", [0]) for _ in range(k)]
        self.shapes = [array("q") for _ in range(k)]
        self.written = [0] * k
        self.vars: list[Any] = [None] * k
        return keys

    def add(self, sample: Any) -> None:
        where = f"{self.path}: sample {self.n}"
        fields = dict(sample_fields(sample, where))
        keys = self._start(fields) if self.keys is None else self.keys
        names = [spec["name"] for spec in keys]
        if set(fields) != set(names):
            missing, extra = sorted(set(names) - set(fields)), sorted(set(fields) - set(names))
            raise ContainerError(
                f"{where}: an ADIOS2 dataset needs the same attributes in every sample (those of sample 0); "
                f"missing {missing}, extra {extra}. Use the pickle or pt format for varying attributes"
            )
        for j, spec in enumerate(keys):
            value = fields[spec["name"]]
            kind = JSON_KIND if isinstance(value, str) else dtype_name(value.dtype)
            ndim = 0 if isinstance(value, str) else value.dim()
            if kind != spec["dtype"] or ndim != spec["ndim"]:
                raise ContainerError(
                    f"{where}: attribute {spec['name']!r} is {kind} with {ndim} dims, but sample 0 has "
                    f"{spec['dtype']} with {spec['ndim']} dims; an ADIOS2 column needs one dtype and ndim"
                )
            column = _column(value)
            self.crcs.append(zlib.crc32(column))  # pyright: ignore[reportArgumentType]  # numpy stubs: buffer from 3.12
            self.pending[j].append(column)
            self.pending_bytes += column.nbytes
            self.offsets[j].append(self.offsets[j][-1] + column.size)
            if ndim and not isinstance(value, str):  # ndim is 0 for JSON text
                self.shapes[j].extend(value.shape)
        self.n += 1
        if self.pending_bytes >= _CHUNK_BYTES:
            self.flush()

    def _put(self, name: str, array: np.ndarray, start: int, var: Any = None) -> Any:
        end = start + array.size
        if var is None:
            var = self.io.define_variable(name, array, [end], [start], [array.size])
        else:
            var.set_shape([end])
            var.set_selection([[start], [array.size]])
        self.stream.write(var, array)
        return var

    def flush(self) -> None:
        put = False
        for j in range(len(self.keys or [])):
            if not self.pending[j]:
                continue
            chunk = np.concatenate(self.pending[j])
            self.pending[j] = []
            if chunk.size:
                self.vars[j] = self._put(f"k{j}/data", chunk, self.written[j], self.vars[j])
                self.written[j] += chunk.size
                put = True
        self.pending_bytes = 0
        if put:  # write the data now (BP5 writes metadata at close)
            self.stream.engine.perform_data_write()

    def finish(self, header: dict[str, Any]) -> int:
        self.flush()
        keys = self.keys or []
        for j, spec in enumerate(keys):
            if self.vars[j] is None:  # every sample empty for this key
                self._put(f"k{j}/data", np.zeros(0, dtype=storage_dtype(spec["dtype"])), 0)
            self._put(f"k{j}/offsets", np.frombuffer(self.offsets[j], dtype=np.int64), 0)
            if spec["ndim"]:
                self._put(f"k{j}/shapes", np.frombuffer(self.shapes[j], dtype=np.int64), 0)
        self._put("crc32", np.frombuffer(self.crcs, dtype=np.uint32), 0)
        full = {**header, "n_samples": self.n, "keys": keys}
        text = header_bytes(full).decode()
        self.stream.write_attribute(ATTRIBUTE, text)
        self.stream.write_attribute(ATTRIBUTE_CRC, str(zlib.crc32(text.encode())))
        self.close()
        return self.n

    def close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            stream.close()
