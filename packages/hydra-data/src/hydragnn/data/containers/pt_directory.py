"""Directory of PyTorch ``.pt`` files, one sample each, loaded with ``weights_only=True``.

On-disk layout::

    <dir>/manifest.json     the JSON header of :mod:`.base` plus
                            "files": {"digits": d, "sizes": [bytes...], "crc32": [...]}
    <dir>/000000.pt ...     torch.save({"hydragnn_pt": <version>, "fields": {key: tensor | json_text}})

Sample ``i`` lives in ``f"{i:0{d}d}.pt"``. Each file is checked against its size and CRC from the
manifest before ``torch.load(weights_only=True)`` sees it.

A directory without ``manifest.json`` holding ``*.pt`` files written by someone else (plain PyG
``Data`` objects or dicts of tensors saved with ``torch.save``) is read too, in natural file-name
order, with ``weights_only=True`` and PyG's ``Data`` classes as the only extra safe globals; it has
no schema, normalization or metadata.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterable, Sized
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from ..errors import ContainerError
from ..safe_load import load_tensors
from .base import ContainerDataset, check_version, parse_header_bytes
from .codec import build_data, loads_json, sample_fields

MANIFEST = "manifest.json"
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
    VERSION = 1

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_dir() and ((path / MANIFEST).is_file() or _has_pt_files(path))

    @classmethod
    def detect_own(cls, path: Path) -> bool:
        return path.is_dir() and (path / MANIFEST).is_file()

    @classmethod
    def write(cls, path: Path, samples: Iterable[Data], header: dict[str, Any]) -> int:
        digits = max(_DIGITS, len(str(len(samples) - 1))) if isinstance(samples, Sized) else _DIGITS
        path.mkdir()
        sizes: list[int] = []
        crcs: list[int] = []
        for i, sample in enumerate(samples):
            fields = dict(sample_fields(sample, f"{path}: sample {i}"))
            buf = io.BytesIO()
            torch.save({"hydragnn_pt": cls.VERSION, "fields": fields}, buf)
            data = buf.getbuffer()
            with open(path / f"{i:0{digits}d}.pt", "wb") as f:
                f.write(data)
            sizes.append(len(data))
            crcs.append(zlib.crc32(data))
        manifest = {**header, "n_samples": len(sizes), "files": {"digits": digits, "sizes": sizes, "crc32": crcs}}
        with open(path / MANIFEST, "w") as f:
            json.dump(manifest, f, allow_nan=True, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        return len(sizes)

    def _open(self) -> None:
        where = str(self.path)
        if not self.path.is_dir():
            raise ContainerError(f"{where}: a .pt dataset is a directory, found a file")
        manifest_path = self.path / MANIFEST
        self._foreign: list[str] | None = None
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
        files = manifest.get("files")
        if not (
            isinstance(files, dict)
            and isinstance(files.get("digits"), int)
            and all(isinstance(files.get(k), list) and len(files[k]) == self._n for k in ("sizes", "crc32"))
        ):
            raise ContainerError(
                f"{manifest_path}: manifest 'files' entry is missing or inconsistent with {self._n} samples"
            )
        self._digits: int = files["digits"]
        self._sizes: list[int] = files["sizes"]
        self._crcs: list[int] = files["crc32"]

    def file_of(self, index: int) -> Path:
        """The file holding sample ``index`` (non-negative)."""
        if self._foreign is not None:
            return self.path / self._foreign[index]
        return self.path / f"{index:0{self._digits}d}.pt"

    def _read(self, index: int) -> Data:
        file = self.file_of(index)
        where = f"{file}: sample {index}"
        try:
            info = file.stat()
        except FileNotFoundError:
            raise ContainerError(f"{where}: sample file is missing") from None
        except OSError as exc:
            raise ContainerError(f"{where}: cannot read the sample file: {exc}") from None
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero would never end
            raise ContainerError(f"{where}: not a regular file (a FIFO, device or socket); refused")
        limit = self._sizes[index] if self._foreign is None else MAX_FOREIGN_SAMPLE_BYTES
        if info.st_size > limit:
            raise ContainerError(
                f"{where}: sample file is {info.st_size} bytes, more than the {limit} bytes "
                f"{'the manifest records' if self._foreign is None else 'allowed for a sample'}; refused before reading"
            )
        with open(file, "rb") as fh:
            raw = fh.read(limit + 1)  # bounded even if the file grows after the stat
        if self._foreign is None:
            if len(raw) != self._sizes[index]:
                raise ContainerError(
                    f"{where}: sample file is {len(raw)} bytes, expected {self._sizes[index]}: truncated or replaced"
                )
            if zlib.crc32(raw) != self._crcs[index]:
                raise ContainerError(f"{where}: sample file is corrupted (checksum mismatch)")
            obj = self._load(raw, where, [])
            if not isinstance(obj, dict) or not isinstance(obj.get("fields"), dict):
                raise ContainerError(f"{where}: not a HydraGNN .pt sample (expected a dict with 'fields')")
            check_version(obj.get("hydragnn_pt"), self.VERSION, "pt sample", where)
            fields = {k: loads_json(v, k, where) if isinstance(v, str) else v for k, v in obj["fields"].items()}
            return build_data(fields)
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
