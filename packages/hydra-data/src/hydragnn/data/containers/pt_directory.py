"""Directory of PyTorch ``.pt`` files, loaded with ``weights_only=True``: samples in chunks.

On-disk layout (format version 3, what :meth:`PtDirectoryDataset.write` writes)::

    <dir>/manifest.json         the JSON header of :mod:`.base` plus
                                "files": {"digits": d, "starts": [first sample of each chunk...],
                                          "sizes": [bytes...], "crc32": [...]}
    <dir>/chunk_000000.pt ...   torch.save({"hydragnn_pt": 3, "n": samples in the chunk,
                                            "fields": {key: packed}})

A chunk holds up to :data:`CHUNK_SAMPLES` consecutive samples (fewer when they pass
:data:`CHUNK_BYTES`), its fields packed as :mod:`.pt_chunk` describes. One file per chunk
instead of per sample: a ``torch.save`` and a file cost ~2 ms each, more than preparing a small
sample. A read loads and checks the chunk once (the last one is kept decoded, so reading in
order costs one load per chunk) and returns the sample's own copies of its tensors. A
:class:`~.packed_chunk.PackedChunk` given to :meth:`PtDirectoryDataset.write` (up to
:data:`CHUNK_SAMPLES` samples and :data:`CHUNK_BYTES`) becomes one chunk file as it is.

Version 1 directories (one ``000000.pt`` file per sample: ``{"hydragnn_pt": 1, "fields": {...}}``,
``"files": {"digits", "sizes", "crc32"}`` per sample) are still read. Each file is checked against
its size and CRC from the manifest before ``torch.load(weights_only=True)`` sees it.

A directory without ``manifest.json`` holding ``*.pt`` files written by someone else (plain PyG
``Data`` objects or dicts of tensors saved with ``torch.save``) is read too, in natural file-name
order, with ``weights_only=True`` and PyG's ``Data`` classes as the only extra safe globals; it has
no schema, normalization or metadata.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import torch
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from ..errors import ContainerError
from ..io.safe_load import load_tensors
from .base import ContainerDataset, check_version, parse_header_bytes
from .codec import build_data, loads_json, sample_fields
from .packed_chunk import PackedChunk, each_sample
from .pt_chunk import ChunkField, pack_chunk, pack_samples, unpack_chunk

MANIFEST = "manifest.json"
MAX_DIGITS = 20
"""Widest file number a manifest may declare (``digits``: a crafted 2**30 would format a GiB name)."""
CHUNK_SAMPLES = 256
"""Most samples in one chunk file."""
CHUNK_BYTES = 16 << 20
"""A chunk is closed once its tensors reach this many bytes (large samples: fewer per chunk)."""
_PYG_SAFE_GLOBALS = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]
_DIGITS = 6


def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _has_pt_files(path: Path) -> bool:
    with os.scandir(path) as entries:
        return any(e.name.endswith(".pt") and e.is_file() for e in entries)


MAX_FOREIGN_SAMPLE_BYTES = 1 << 30
"""Largest sample file read from a ``.pt`` directory without a manifest (1 GiB)."""


class PtDirectoryDataset(ContainerDataset):
    """Random-access dataset stored as a directory of ``.pt`` files (see the module docstring).

    Args:
        path: the directory.

    Raises:
        ContainerError: when the directory is missing, holds no dataset, has a corrupted manifest or
            was written by a newer format version. A missing or corrupted sample file raises on access.
    """

    FORMAT = "pt"
    VERSION = 3

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_dir() and ((path / MANIFEST).is_file() or _has_pt_files(path))

    @classmethod
    def detect_own(cls, path: Path) -> bool:
        return path.is_dir() and (path / MANIFEST).is_file()

    @classmethod
    def write(cls, path: Path, samples: Iterable[Data | PackedChunk], header: dict[str, Any]) -> int:
        path.mkdir()
        digits = _DIGITS
        starts: list[int] = []
        sizes: list[int] = []
        crcs: list[int] = []
        chunk: list[dict[str, torch.Tensor | str]] = []
        chunk_bytes = 0
        n = 0

        def flush(packed: dict[str, Any], count: int) -> None:
            buf = io.BytesIO()
            torch.save({"hydragnn_pt": cls.VERSION, "n": count, **packed}, buf)
            data = buf.getbuffer()
            with open(path / f"chunk_{len(starts):0{digits}d}.pt", "wb") as f:
                f.write(data)
            starts.append(n - count)
            sizes.append(len(data))
            crcs.append(zlib.crc32(data))

        for item in samples:
            if isinstance(item, PackedChunk) and item.count <= CHUNK_SAMPLES and item.nbytes <= CHUNK_BYTES:
                if chunk:
                    flush(pack_samples(chunk), len(chunk))
                    chunk, chunk_bytes = [], 0
                n += item.count
                flush(pack_chunk(item, f"{path}: samples {n - item.count}-{n - 1}"), item.count)
                continue
            for sample in each_sample([item]):
                fields = dict(sample_fields(sample, f"{path}: sample {n}"))
                chunk.append(fields)
                chunk_bytes += sum(
                    v.numel() * v.element_size() if isinstance(v, torch.Tensor) else len(v) for v in fields.values()
                )
                n += 1
                if len(chunk) == CHUNK_SAMPLES or chunk_bytes >= CHUNK_BYTES:
                    flush(pack_samples(chunk), len(chunk))
                    chunk, chunk_bytes = [], 0
        if chunk:
            flush(pack_samples(chunk), len(chunk))
        manifest = {
            **header,
            "n_samples": n,
            "files": {"digits": digits, "starts": starts, "sizes": sizes, "crc32": crcs},
        }
        with open(path / MANIFEST, "w") as f:
            json.dump(manifest, f, allow_nan=True, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        return n

    def _open(self) -> None:
        where = str(self.path)
        if not self.path.is_dir():
            raise ContainerError(f"{where}: a .pt dataset is a directory, found a file")
        manifest_path = self.path / MANIFEST
        self._foreign: list[str] | None = None
        self._chunk: tuple[int, tuple[list[ChunkField], list[Any] | None]] | None = None  # the last chunk read, decoded
        if not manifest_path.is_file():
            names = sorted(
                (e.name for e in os.scandir(self.path) if e.name.endswith(".pt") and e.is_file()), key=_natural_key
            )
            if not names:
                raise ContainerError(f"{where}: not a .pt dataset (no {MANIFEST} and no *.pt files)")
            self._foreign = names
            self._n = len(names)
            return
        manifest = parse_header_bytes(manifest_path.read_bytes(), str(manifest_path))
        self._set_header(manifest)
        self._version: int = manifest["version"]
        files = manifest.get("files")
        per_file = self._n if self._version == 1 else None
        keys = ("sizes", "crc32") if self._version == 1 else ("starts", "sizes", "crc32")
        if not (
            isinstance(files, dict)
            and isinstance(files.get("digits"), int)
            and all(isinstance(files.get(k), list) for k in keys)
            and len({len(files[k]) for k in keys}) == 1
            and (per_file is None or len(files["sizes"]) == per_file)
            and all(isinstance(v, int) and not isinstance(v, bool) for k in keys for v in files[k])
        ):
            raise ContainerError(
                f"{manifest_path}: manifest 'files' entry is missing or inconsistent with {self._n} samples"
            )
        if isinstance(files["digits"], bool) or not 1 <= files["digits"] <= MAX_DIGITS:
            raise ContainerError(
                f"{manifest_path}: manifest 'files.digits' is {files['digits']!r}, expected 1-{MAX_DIGITS}"
            )
        self._digits: int = files["digits"]
        self._sizes: list[int] = files["sizes"]
        self._crcs: list[int] = files["crc32"]
        if self._version >= 2:
            starts = files["starts"]
            ends = [*starts[1:], self._n]
            if (starts and starts[0] != 0) or (self._n and not starts) or any(a >= b for a, b in zip(starts, ends)):
                raise ContainerError(
                    f"{manifest_path}: manifest chunk starts {starts[:8]} do not cover {self._n} samples in order"
                )
            self._starts: list[int] = starts

    def _chunk_index(self, index: int) -> int:
        return bisect.bisect_right(self._starts, index) - 1

    def file_of(self, index: int) -> Path:
        """The file holding sample ``index`` (non-negative): its chunk, or its own file."""
        if self._foreign is not None:
            return self.path / self._foreign[index]
        if self._version >= 2:
            return self.path / f"chunk_{self._chunk_index(index):0{self._digits}d}.pt"
        return self.path / f"{index:0{self._digits}d}.pt"

    @staticmethod
    def _file_bytes(file: Path, where: str, kind: str, limit: int, size: int | None, crc: int | None) -> bytes:
        """The bytes of ``file`` (a ``kind`` file: "sample" or "chunk"), read only if it is a
        regular file of at most ``limit`` bytes; with the manifest's ``size`` and ``crc``, checked
        against them."""
        try:
            info = file.stat()
        except FileNotFoundError:
            raise ContainerError(f"{where}: {kind} file is missing") from None
        except OSError as exc:
            raise ContainerError(f"{where}: cannot read the {kind} file: {exc}") from None
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero would never end
            raise ContainerError(f"{where}: not a regular file (a FIFO, device or socket); refused")
        if info.st_size > limit:
            raise ContainerError(
                f"{where}: {kind} file is {info.st_size} bytes, more than the {limit} bytes "
                f"{'the manifest records' if size is not None else 'allowed for a sample'}; refused before reading"
            )
        with open(file, "rb") as fh:
            raw = fh.read(limit + 1)  # bounded even if the file grows after the stat
        if size is not None and len(raw) != size:
            raise ContainerError(f"{where}: {kind} file is {len(raw)} bytes, expected {size}: truncated or replaced")
        if crc is not None and zlib.crc32(raw) != crc:
            raise ContainerError(f"{where}: {kind} file is corrupted (checksum mismatch)")
        return raw

    def _read_chunked(self, index: int) -> Data:
        k = self._chunk_index(index)
        if self._chunk is None or self._chunk[0] != k:
            file = self.file_of(index)
            count = (self._starts[k + 1] if k + 1 < len(self._starts) else self._n) - self._starts[k]
            where = f"{file}: chunk {k} (samples {self._starts[k]}-{self._starts[k] + count - 1})"
            size, crc = self._sizes[k], self._crcs[k]
            raw = self._file_bytes(file, f"{file}: sample {index}", "chunk", size, size, crc)
            obj = self._load(raw, where, [], max_bytes=2 * len(raw) + 4096)
            if not isinstance(obj, dict) or not isinstance(obj.get("fields"), dict):
                raise ContainerError(f"{where}: not a HydraGNN .pt chunk (expected a dict with 'fields')")
            check_version(obj.get("hydragnn_pt"), self.VERSION, "pt chunk", where)
            if obj.get("n") != count:
                raise ContainerError(f"{where}: holds {obj.get('n')!r} samples, the manifest says {count}")
            self._chunk = (k, unpack_chunk(obj["fields"], obj.get("orders"), count, where, len(raw)))
        j = index - self._starts[k]
        where = f"{self.file_of(index)}: sample {index}"
        packed, orders = self._chunk[1]
        fields = {}
        for field in packed:
            value = field.get(j)
            if value is not None:
                fields[field.key] = loads_json(value, field.key, where) if isinstance(value, str) else value
        order = orders[j] if orders is not None else None
        return build_data(fields if order is None else {key: fields[key] for key in order})

    def _read(self, index: int) -> Data:
        if self._foreign is None and self._version >= 2:
            return self._read_chunked(index)
        file = self.file_of(index)
        where = f"{file}: sample {index}"
        if self._foreign is None:
            size, crc = self._sizes[index], self._crcs[index]
            raw = self._file_bytes(file, where, "sample", size, size, crc)
            obj = self._load(raw, where, [])
            if not isinstance(obj, dict) or not isinstance(obj.get("fields"), dict):
                raise ContainerError(f"{where}: not a HydraGNN .pt sample (expected a dict with 'fields')")
            check_version(obj.get("hydragnn_pt"), 1, "pt sample", where)
            fields = {k: loads_json(v, k, where) if isinstance(v, str) else v for k, v in obj["fields"].items()}
            return build_data(fields)
        raw = self._file_bytes(file, where, "sample", MAX_FOREIGN_SAMPLE_BYTES, None, None)
        obj = self._load(raw, where, _PYG_SAFE_GLOBALS)
        if isinstance(obj, Data):
            return obj
        if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
            return build_data(obj)
        raise ContainerError(f"{where}: expected a PyG Data or a dict of tensors, found {type(obj).__name__}")

    @staticmethod
    def _load(raw: bytes, where: str, safe_globals: list[Any], max_bytes: int | None = None) -> Any:
        try:
            return load_tensors(raw, safe_globals, max_bytes=max_bytes)
        except ValueError as exc:
            raise ContainerError(f"{where}: not a readable .pt sample: {exc}") from None
