"""Single-file pickle container, read through an allowlisting unpickler.

On-disk layout (all integers little-endian)::

    header   (56 bytes)  magic b"HGNNPKL\\n", version u32, n_samples u64, index_offset u64,
                         meta_offset u64, meta_len u64, index_crc32 u32, meta_crc32 u32,
                         header_crc32 u32 (of the 52 bytes before it)
    payloads             one pickle per sample, back to back
    index                offsets int64[n + 1] (absolute; payload i is [offsets[i], offsets[i+1])),
                         then crc32 uint32[n] of each payload
    meta                 the JSON header of :mod:`.base` (schema, normalization, metadata)

A payload is plain Python only: ``{key: ("t", dtype, shape, bytearray) | ("j", json_text)}``. The
unpickler refuses every global (its allowlist is empty), so a crafted file cannot run code; every
payload is also checked against its CRC before it is unpickled. One sample is read with a single
``pread`` of its byte range, without touching the others.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
from torch_geometric.data import Data

from ..errors import ContainerError
from .base import ContainerDataset, check_version, header_bytes, parse_header_bytes
from .codec import build_data, dtype_name, loads_json, lookup_dtype, sample_fields, tensor_bytes, tensor_from_bytes
from .packed_chunk import PackedChunk, each_sample

MAGIC = b"HGNNPKL\n"
_HEADER = struct.Struct("<8sIQQQQII")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
_PROTOCOL = 5  # native bytearray opcode: payloads need no global at all


class _AllowlistUnpickler(pickle.Unpickler):
    """An unpickler that resolves no global: only builtin containers, numbers, str and bytes load."""

    ALLOWED: frozenset[tuple[str, str]] = frozenset()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:  # pragma: no cover - the allowlist is empty
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


def safe_loads(payload: bytes) -> Any:
    """Unpickle ``payload`` without resolving any global (raises ``pickle.UnpicklingError``)."""
    return _AllowlistUnpickler(io.BytesIO(payload)).load()


def encode_sample(sample: Any, where: str) -> bytes:
    """The pickled plain-Python payload of one sample."""
    record: dict[str, tuple] = {}
    for key, value in sample_fields(sample, where):
        if isinstance(value, str):
            record[key] = ("j", value)
        else:
            record[key] = ("t", dtype_name(value.dtype), tuple(value.shape), tensor_bytes(value))
    return pickle.dumps(record, protocol=_PROTOCOL)


def decode_record(record: Any, where: str) -> Data:
    """Rebuild a ``Data`` from an unpickled payload, validating its structure."""
    if not isinstance(record, dict):
        raise ContainerError(f"{where}: payload must be a dict of attributes, found {type(record).__name__}")
    fields: dict[str, Any] = {}
    for key, entry in record.items():
        if not isinstance(key, str) or not isinstance(entry, tuple) or not entry:
            raise ContainerError(f"{where}: malformed attribute entry {key!r}")
        if entry[0] == "j" and len(entry) == 2:
            fields[key] = loads_json(entry[1], key, where)
        elif entry[0] == "t" and len(entry) == 4:
            _, name, shape, buf = entry
            if not isinstance(shape, tuple) or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise ContainerError(f"{where}: attribute {key!r}: malformed shape {shape!r}")
            if not isinstance(buf, (bytes, bytearray)):
                raise ContainerError(
                    f"{where}: attribute {key!r}: tensor data must be bytes, found {type(buf).__name__}"
                )
            fields[key] = tensor_from_bytes(
                lookup_dtype(name, f"{where}: attribute {key!r}"), shape, buf, f"{where}: attribute {key!r}"
            )
        else:
            raise ContainerError(f"{where}: malformed attribute entry {key!r} (kind {entry[0]!r})")
    return build_data(fields)


def write_payloads(path: Path, payloads: Iterable[bytes], header: dict[str, Any]) -> int:
    """Write a pickle container from already pickled payloads; returns the sample count.

    Args:
        path: destination file (overwritten).
        payloads: one pickled sample each (normally from :func:`encode_sample`).
        header: the JSON header; ``n_samples`` is filled in here.
    """
    offsets = [HEADER_SIZE]
    crcs: list[int] = []
    with open(path, "wb") as f:
        f.write(b"\0" * HEADER_SIZE)
        for payload in payloads:
            f.write(payload)
            crcs.append(zlib.crc32(payload))
            offsets.append(offsets[-1] + len(payload))
        index = np.asarray(offsets, dtype="<i8").tobytes() + np.asarray(crcs, dtype="<u4").tobytes()
        header = {**header, "n_samples": len(crcs)}
        meta = header_bytes(header)
        f.write(index)
        f.write(meta)
        fixed = _HEADER.pack(
            MAGIC,
            header["version"],
            len(crcs),
            offsets[-1],
            offsets[-1] + len(index),
            len(meta),
            zlib.crc32(index),
            zlib.crc32(meta),
        )
        f.seek(0)
        f.write(fixed + _HEADER_CRC.pack(zlib.crc32(fixed)))
        f.flush()
        os.fsync(f.fileno())
    return len(crcs)


class PickleDataset(ContainerDataset):
    """Random-access dataset stored in one pickle container file (see the module docstring).

    Args:
        path: the container file.

    Raises:
        ContainerError: when the file is missing, not a pickle container, truncated, corrupted or
            written by a newer format version.
    """

    FORMAT = "pickle"
    VERSION = 1

    @classmethod
    def detect(cls, path: Path) -> bool:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC

    @classmethod
    def write(cls, path: Path, samples: Iterable[Data | PackedChunk], header: dict[str, Any]) -> int:
        payloads = (encode_sample(s, f"{path}: sample {i}") for i, s in enumerate(each_sample(samples)))
        return write_payloads(path, payloads, header)

    def _open(self) -> None:
        where = str(self.path)
        if not self.path.is_file():
            raise ContainerError(f"{where}: a pickle dataset is a single file, found a directory or special file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(HEADER_SIZE)
            if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                raise ContainerError(f"{where}: not a HydraGNN pickle dataset (missing magic {MAGIC!r})")
            check_version(struct.unpack_from("<I", head, len(MAGIC))[0], self.VERSION, self.FORMAT, where)
            if len(head) < HEADER_SIZE:
                raise ContainerError(
                    f"{where}: truncated pickle dataset ({size} bytes, shorter than its {HEADER_SIZE}-byte header)"
                )
            fixed = head[: _HEADER.size]
            if _HEADER_CRC.unpack_from(head, _HEADER.size)[0] != zlib.crc32(fixed):
                raise ContainerError(f"{where}: pickle dataset header is corrupted (checksum mismatch)")
            _, _, n, index_offset, meta_offset, meta_len, index_crc, meta_crc = _HEADER.unpack(fixed)
            if meta_offset - index_offset != 12 * n + 8 or index_offset < HEADER_SIZE:
                raise ContainerError(f"{where}: pickle dataset header is inconsistent (index of {n} samples)")
            if size != meta_offset + meta_len:
                raise ContainerError(
                    f"{where}: pickle dataset is {size} bytes but its header expects {meta_offset + meta_len}: "
                    "the file is truncated or corrupted"
                )
            f.seek(index_offset)
            index = f.read(meta_offset - index_offset)
            meta = f.read(meta_len)
        if zlib.crc32(index) != index_crc:
            raise ContainerError(f"{where}: pickle dataset index is corrupted (checksum mismatch)")
        if zlib.crc32(meta) != meta_crc:
            raise ContainerError(f"{where}: pickle dataset header JSON is corrupted (checksum mismatch)")
        self._set_header(parse_header_bytes(meta, where))
        if self._n != n:
            raise ContainerError(f"{where}: header says {self._n} samples, index holds {n}")
        self._offsets = np.frombuffer(index, dtype="<i8", count=n + 1)
        self._crcs = np.frombuffer(index, dtype="<u4", count=n, offset=8 * (n + 1))
        if self._offsets[0] != HEADER_SIZE or self._offsets[-1] != index_offset or np.any(np.diff(self._offsets) < 0):
            raise ContainerError(f"{where}: pickle dataset index holds invalid offsets")
        self._fd: int | None = None
        self._pid = -1

    def _file(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDONLY)
            self._pid = os.getpid()
        return self._fd

    def _read(self, index: int) -> Data:
        where = f"{self.path}: sample {index}"
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        payload = os.pread(self._file(), end - start, start)
        if len(payload) != end - start:
            raise ContainerError(f"{where}: truncated payload ({len(payload)} of {end - start} bytes)")
        if zlib.crc32(payload) != int(self._crcs[index]):
            raise ContainerError(f"{where}: payload is corrupted (checksum mismatch)")
        try:
            record = safe_loads(payload)
        except pickle.UnpicklingError as exc:
            raise ContainerError(
                f"{where}: refused to unpickle ({exc}); a HydraGNN pickle dataset holds plain data only, "
                "this file may be malicious"
            ) from None
        except Exception as exc:
            raise ContainerError(f"{where}: payload cannot be unpickled ({type(exc).__name__}: {exc})") from None
        return decode_record(record, where)

    def close(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and self._pid == os.getpid():
            os.close(fd)
        self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fd"], state["_pid"] = None, -1
        return state
