"""Directory of PyTorch ``.pt`` files, loaded with ``weights_only=True``: samples in chunks.

On-disk layout (format version 3, what :meth:`PtDirectoryDataset.write` writes)::

    <dir>/manifest.json         the JSON header of :mod:`.base` plus
                                "files": {"digits": d, "starts": [first sample of each chunk...],
                                          "sizes": [bytes...], "crc32": [...]}
    <dir>/chunk_000000.pt ...   torch.save({"hydragnn_pt": 3, "n": samples in the chunk,
                                            "fields": {key: packed}})

A chunk holds up to :data:`CHUNK_SAMPLES` consecutive samples (fewer when they pass
:data:`CHUNK_BYTES`). A field every sample of the chunk has as a tensor of one dtype and rank is
packed as ``{"data": 1-D concatenation, "shapes": int64 [n, rank]}``; any other as ``{"values":
[per-sample tensor, JSON text or None (absent)]}``. Since version 3 integer data is stored in
the narrowest integer dtype that holds it, with ``"dtype"`` naming its own (edge indices of small
graphs: one byte instead of eight), and a field given as :class:`~.packed_chunk.Rows` as
``{"table": [T, w], "index": [R], "shapes"}`` (a periodic cell's edge offsets: 27 rows per cell
and an index per edge instead of three float64 per edge); a read restores the exact tensors. One
file per chunk instead of per sample: a ``torch.save`` and a file cost ~2 ms each, more than
preparing a small sample. A read loads and checks the chunk once (the last one is kept decoded,
so reading in order costs one load per chunk) and returns the sample's own copies of its
tensors. A :class:`~.packed_chunk.PackedChunk` given to :meth:`PtDirectoryDataset.write` (up to
:data:`CHUNK_SAMPLES` samples and :data:`CHUNK_BYTES`) is already this layout and becomes one
chunk file as it is. Version 2 chunks (no narrowing, no tables) are still read.

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
import itertools
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import torch
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from ..errors import ContainerError
from ..io.safe_load import load_tensors
from .base import ContainerDataset, check_version, parse_header_bytes
from .codec import DTYPES, build_data, compact, dtype_name, loads_json, sample_fields
from .packed_chunk import PackedChunk, Rows, each_sample

MANIFEST = "manifest.json"
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
                    flush(_pack(chunk), len(chunk))
                    chunk, chunk_bytes = [], 0
                n += item.count
                flush(_packed_fields(item, f"{path}: samples {n - item.count}-{n - 1}"), item.count)
                continue
            for sample in each_sample([item]):
                fields = dict(sample_fields(sample, f"{path}: sample {n}"))
                chunk.append(fields)
                chunk_bytes += sum(
                    v.numel() * v.element_size() if isinstance(v, torch.Tensor) else len(v) for v in fields.values()
                )
                n += 1
                if len(chunk) == CHUNK_SAMPLES or chunk_bytes >= CHUNK_BYTES:
                    flush(_pack(chunk), len(chunk))
                    chunk, chunk_bytes = [], 0
        if chunk:
            flush(_pack(chunk), len(chunk))
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
        self._chunk: tuple[int, tuple[list[_Field], list[Any] | None]] | None = None  # the last chunk read, decoded
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
            obj = self._load(raw, where, [])
            if not isinstance(obj, dict) or not isinstance(obj.get("fields"), dict):
                raise ContainerError(f"{where}: not a HydraGNN .pt chunk (expected a dict with 'fields')")
            check_version(obj.get("hydragnn_pt"), self.VERSION, "pt chunk", where)
            if obj.get("n") != count:
                raise ContainerError(f"{where}: holds {obj.get('n')!r} samples, the manifest says {count}")
            self._chunk = (k, _unpack(obj["fields"], obj.get("orders"), count, where))
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
    def _load(raw: bytes, where: str, safe_globals: list[Any]) -> Any:
        try:
            return load_tensors(raw, safe_globals)
        except ValueError as exc:
            raise ContainerError(f"{where}: not a readable .pt sample: {exc}") from None


_NARROW = (torch.int8, torch.int16, torch.int32)


def _narrowed(data: torch.Tensor) -> dict[str, Any]:
    """A field's 1-D data as stored: integers in the narrowest integer dtype that holds them, with
    ``"dtype"`` naming theirs (edge indices of small graphs take a byte instead of eight)."""
    if data.dtype in (torch.int16, torch.int32, torch.int64) and data.numel():
        low, high = (int(v) for v in torch.aminmax(data))
        for narrow in _NARROW:
            info = torch.iinfo(narrow)
            if narrow.itemsize < data.element_size() and info.min <= low and high <= info.max:
                return {"data": data.to(narrow), "dtype": dtype_name(data.dtype)}
    return {"data": data}


def _packed_fields(chunk: PackedChunk, where: str) -> dict[str, Any]:
    """The chunk file's ``fields`` of a packed chunk (each field's data compact, as a sample's;
    :class:`~.packed_chunk.Rows` as their table and narrowed index)."""
    fields: dict[str, Any] = {}
    for key, (data, shapes) in chunk.fields.items():
        if isinstance(data, Rows):
            index = _narrowed(compact(data.index, key, where))["data"]
            fields[key] = {"table": compact(data.table, key, where), "index": index, "shapes": shapes}
        else:
            fields[key] = {**_narrowed(compact(data, key, where)), "shapes": shapes}
    return {"fields": fields}


def _pack(chunk: list[dict[str, torch.Tensor | str]]) -> dict[str, Any]:
    """``{"fields": packed fields, "orders": per-sample key order}`` of a chunk's samples (see
    the module docstring); ``orders`` only when a sample's attribute order is not the order of
    first appearance, so that a read gives the attributes in the order written."""
    keys = list(dict.fromkeys(k for fields in chunk for k in fields))
    orders = [list(fields) if list(fields) != [k for k in keys if k in fields] else None for fields in chunk]
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [fields.get(key) for fields in chunk]
        first = values[0]
        if isinstance(first, torch.Tensor) and all(
            isinstance(v, torch.Tensor) and v.dtype == first.dtype and v.dim() == first.dim() for v in values
        ):
            tensors = cast(list[torch.Tensor], values)
            shapes = torch.tensor([list(t.shape) for t in tensors], dtype=torch.int64).reshape(
                len(tensors), first.dim()
            )
            out[key] = {**_narrowed(torch.cat([t.reshape(-1) for t in tensors])), "shapes": shapes}
        else:
            out[key] = {"values": values}
    return {"fields": out, **({"orders": orders} if any(o is not None for o in orders) else {})}


class _Field:
    """One packed field of a decoded chunk: sample ``j``'s value by :meth:`get` (a fresh tensor,
    JSON text, or ``None`` when the sample has no such field)."""

    def __init__(self, key: str, packed: Any, count: int, where: str) -> None:
        self.key = key
        bad = ContainerError(f"{where}: field {key!r} is not a packed field of {count} samples")
        if not isinstance(packed, dict):
            raise bad
        if "values" in packed:
            values = packed["values"]
            if (
                not isinstance(values, list)
                or len(values) != count
                or not all(v is None or isinstance(v, (torch.Tensor, str)) for v in values)
            ):
                raise bad
            self.values: list[Any] | None = values
            return
        self.values = None
        data, shapes = _decoded(packed, bad), packed.get("shapes")
        if not (
            isinstance(data, torch.Tensor)
            and data.dim() == 1
            and isinstance(shapes, torch.Tensor)
            and shapes.dtype == torch.int64
            and shapes.dim() == 2
            and shapes.shape[0] == count
            and bool((shapes >= 0).all())
        ):
            raise bad
        self.shapes = [tuple(row) for row in shapes.tolist()]
        ends = list(itertools.accumulate(math.prod(shape) for shape in self.shapes))  # Python ints: no overflow
        if (ends[-1] if ends else 0) != data.numel():
            raise ContainerError(
                f"{where}: field {key!r} holds {data.numel()} values, its shapes {ends[-1] if ends else 0}"
            )
        self.data = data
        self.bounds = list(zip([0, *ends[:-1]], ends))

    def get(self, j: int) -> Any:
        if self.values is not None:
            value = self.values[j]
            return value.clone() if isinstance(value, torch.Tensor) else value
        start, end = self.bounds[j]
        return self.data[start:end].view(self.shapes[j]).clone()


def _decoded(packed: dict[Any, Any], bad: ContainerError) -> Any:
    """A packed field's 1-D data: ``data`` as stored, widened to ``dtype`` when named, or
    ``table[index]`` (version 3); ``bad`` for anything else, out-of-range indices included."""
    if "table" in packed:
        table, index = packed.get("table"), packed.get("index")
        if not (
            isinstance(table, torch.Tensor)
            and table.dim() == 2
            and isinstance(index, torch.Tensor)
            and index.dim() == 1
            and index.dtype in (torch.int8, torch.int16, torch.int32, torch.int64)
            and (not index.numel() or (int(index.min()) >= 0 and int(index.max()) < table.shape[0]))
        ):
            raise bad
        return table.index_select(0, index.long()).reshape(-1)
    data, name = packed.get("data"), packed.get("dtype")
    if name is None:
        return data
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if (
        dtype is None
        or dtype.is_floating_point
        or dtype.is_complex
        or dtype == torch.bool
        or not isinstance(data, torch.Tensor)
        or data.dtype not in _NARROW
    ):
        raise bad
    return data.to(dtype)


def _unpack(fields: dict[Any, Any], orders: Any, count: int, where: str) -> tuple[list[_Field], list[Any] | None]:
    """A chunk's packed fields decoded, and its per-sample key orders (checked against them)."""
    if not all(isinstance(k, str) for k in fields):
        raise ContainerError(f"{where}: attribute names must be strings")
    packed = [_Field(key, value, count, where) for key, value in fields.items()]
    if orders is not None:
        if not isinstance(orders, list) or len(orders) != count:
            raise ContainerError(f"{where}: 'orders' is not a list of {count} key orders")
        for j, order in enumerate(orders):
            present = {f.key for f in packed if (f.values[j] is not None if f.values is not None else True)}
            if order is not None and (
                not isinstance(order, list) or set(order) != present or len(order) != len(present)
            ):
                raise ContainerError(f"{where}: sample {j}'s key order does not name its attributes")
    return packed, orders
