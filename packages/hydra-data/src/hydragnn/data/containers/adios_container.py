"""ADIOS2 (BP5, serial) columnar container; needs the optional ``adios2`` package.

On-disk layout: a ``.bp`` directory (``md.idx``, ``md.0``, ``mmd.0``, ``data.0``) plus
``hydragnn-integrity.json``. Attribute keys are numbered ``j = 0 .. K-1`` in first-sample order;
every sample must carry the same keys with the same dtype and number of dimensions.

=====================  ============================================================
ADIOS2 name            content
=====================  ============================================================
``k{j}/data``          1-D global array: the flattened values of key ``j`` of every sample,
                       concatenated (bool / float16 / bfloat16 stored bit-exact as same-width
                       integers; JSON values as UTF-8 bytes)
``k{j}/offsets``       int64 ``[n + 1]``: sample ``i`` is ``data[offsets[i]:offsets[i+1]]``
``k{j}/shapes``        int64 ``[n * ndim]``: the shape of each sample's tensor (absent when ndim 0)
``crc32``              uint32 ``[n * K]``: CRC of each sample's bytes for each key
attribute ``hydragnn``  the JSON header of :mod:`.base` plus ``"keys": [{name, dtype, ndim}]``
=====================  ============================================================

Reading sample ``i`` reads only its slice of each ``k{j}/data`` (one synchronous ``get`` per key
with explicit start/count, into a preallocated buffer); the small offset / shape / CRC arrays are read
once when the dataset is opened. Samples are written in chunks of about 32 MB as growing blocks of
the global arrays, so writing needs memory for one chunk, not for the dataset.

ADIOS2 can crash the process on a garbled metadata file, so the size and CRC of every ADIOS2
metadata file (and the size of the data files) are kept in ``hydragnn-integrity.json`` and checked
before ADIOS2 opens the directory, and a dataset not sealed by this user's writer (nor verified
before) is first read in a child process (:mod:`.adios_trust`).
"""

from __future__ import annotations

import atexit
import json
import os
import weakref
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

import numpy as np
import torch
from torch_geometric.data import Data

from ..errors import ContainerError
from .adios_format import (
    ATTRIBUTE,
    ATTRIBUTE_CRC,
    INTEGRITY,
    ColumnWriter,
    check_integrity,
    import_adios2,
    integrity_record,
    storage_dtype,
)
from .adios_trust import known_good, probe_in_child, remember, seal
from .base import ContainerDataset, parse_header_bytes
from .codec import DTYPES, JSON_KIND, build_data, loads_json
from .packed_chunk import PackedChunk, each_sample

DECLARED_FACTOR = 64
"""Most bytes a variable may declare per byte of the dataset's files (the writer does not compress;
the factor leaves room for one that does)."""
_OPEN: weakref.WeakSet[AdiosDataset] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Release ADIOS2 handles before interpreter shutdown tears the bindings down."""
    for ds in list(_OPEN):
        try:
            ds.close()
        except Exception:
            pass


class AdiosDataset(ContainerDataset):
    """Random-access dataset stored in an ADIOS2 ``.bp`` directory (see the module docstring).

    Args:
        path: the ``.bp`` directory.

    Raises:
        ContainerError: when adios2 is not installed, or the directory is missing, incomplete,
            truncated, corrupted or written by a newer format version.
    """

    FORMAT = "adios"
    VERSION = 1

    # ADIOS2 handles (untyped bindings), set by _connect; None once closed or unpickled
    _adios: Any
    _io: Any
    _stream: Any
    _vars: dict[str, Any] | None

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_dir() and ((path / INTEGRITY).is_file() or (path / "md.idx").is_file())

    @classmethod
    def detect_own(cls, path: Path) -> bool:
        return path.is_dir() and (path / INTEGRITY).is_file()

    @classmethod
    def write(cls, path: Path, samples: Iterable[Data | PackedChunk], header: dict[str, Any]) -> int:
        writer = ColumnWriter(import_adios2(), path)
        try:
            for sample in each_sample(samples):
                writer.add(sample)
            n = writer.finish(header)
        finally:
            writer.close()
        (path / "profiling.json").unlink(missing_ok=True)  # ADIOS2 timing log, not part of the dataset
        record: dict[str, Any] = {"version": cls.VERSION, "files": integrity_record(path)}
        stamp = seal(record)
        if stamp is not None:
            record["seal"] = stamp  # this user's writer made it: later opens skip the child check
        (path / INTEGRITY).write_text(json.dumps(record, separators=(",", ":")))
        return n

    def _open(self) -> None:
        adios2 = import_adios2()
        if not self.path.is_dir():
            raise ContainerError(f"{self.path}: an ADIOS2 dataset is a .bp directory, found a file")
        record = check_integrity(self.path, self.VERSION)
        if not known_good(record):  # foreign or re-sealed: let ADIOS2 parse it in a child first
            probe_in_child(self.path)
            remember(record)
        self._connect(adios2)
        attribute = self._io.inquire_attribute(ATTRIBUTE)
        if attribute is None:
            raise ContainerError(f"{self.path}: ADIOS2 file has no {ATTRIBUTE!r} attribute; not a HydraGNN dataset")
        text = attribute.data_string()
        text = text[0] if isinstance(text, list) else text
        stamp = self._io.inquire_attribute(ATTRIBUTE_CRC)
        if stamp is not None:  # written by every writer since the header CRC was added
            value = stamp.data_string()
            value = value[0] if isinstance(value, list) else value
            if value != str(zlib.crc32(text.encode())):
                raise ContainerError(f"{self.path}: the dataset header is corrupted (checksum mismatch)")
        header = parse_header_bytes(text, str(self.path))
        self._set_header(header)
        keys = header.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, dict) for k in keys):
            raise ContainerError(f"{self.path}: the 'keys' entry of the header is missing or malformed")
        n, k = self._n, len(keys)
        self._keys: list[tuple[str, str, int]] = []
        self._offsets: list[np.ndarray] = []
        self._shapes: list[np.ndarray | None] = []
        for j, spec in enumerate(keys):
            name, dtype, ndim = spec.get("name"), spec.get("dtype"), spec.get("ndim")
            if (
                not isinstance(name, str)
                or (dtype != JSON_KIND and dtype not in DTYPES)
                or not isinstance(ndim, int)
                or ndim < 0
            ):
                raise ContainerError(f"{self.path}: malformed key entry {spec!r}")
            offsets = self._read_full(f"k{j}/offsets", n + 1, np.int64)
            total = self._variable(f"k{j}/data").shape()
            if len(total) == 1:
                self._check_declared(f"k{j}/data", int(total[0]), np.dtype(storage_dtype(dtype)).itemsize)
            if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or [int(offsets[-1])] != list(total):
                raise ContainerError(f"{self.path}: offsets of attribute {name!r} are inconsistent with its data")
            shapes = self._read_full(f"k{j}/shapes", n * ndim, np.int64).reshape(n, ndim) if ndim else None
            if shapes is not None and (
                np.any(shapes < 0) or not np.array_equal(np.prod(shapes, axis=1), np.diff(offsets))
            ):
                raise ContainerError(f"{self.path}: shapes of attribute {name!r} are inconsistent with its offsets")
            self._keys.append((name, dtype, ndim))
            self._offsets.append(offsets)
            self._shapes.append(shapes)
        self._crcs = self._read_full("crc32", n * k, np.uint32).reshape(n, k)

    def _connect(self, adios2: Any | None = None) -> None:
        module: Any = adios2 or import_adios2()
        self._adios = module.Adios()
        self._io = self._adios.declare_io("hydragnn-adios-read")
        try:
            self._stream = module.Stream(self._io, str(self.path), "rra")
        except Exception as exc:
            raise ContainerError(f"{self.path}: ADIOS2 cannot open the dataset: {str(exc).strip()[-300:]}") from None
        self._vars = {}
        self._mode = module.Mode.Sync  # measured faster than Deferred + perform_gets here
        self._pid = os.getpid()
        _OPEN.add(self)

    def _variable(self, name: str) -> Any:
        variables = cast(dict[str, Any], self._vars)  # connected: every read path runs _connect first
        var = variables.get(name)
        if var is None:
            var = self._io.inquire_variable(name)
            if var is None:
                raise ContainerError(f"{self.path}: ADIOS2 variable {name!r} is missing; the dataset is corrupted")
            variables[name] = var
        return var

    def _check_declared(self, name: str, count: int, itemsize: int) -> None:
        """Refuse a variable that declares more bytes than the dataset's files can hold (up to
        :data:`DECLARED_FACTOR` times their size), before anything is allocated."""
        if not hasattr(self, "_disk_bytes"):
            self._disk_bytes = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        limit = DECLARED_FACTOR * self._disk_bytes + (1 << 20)
        if count * itemsize > limit:
            raise ContainerError(
                f"{self.path}: ADIOS2 variable {name!r} declares {count} values ({count * itemsize} bytes), more than "
                f"its files' {self._disk_bytes} bytes can hold: a crafted size; refused before reading"
            )

    def _read_full(self, name: str, count: int, dtype: Any) -> np.ndarray:
        var = self._variable(name)
        if list(var.shape()) != [count]:
            raise ContainerError(f"{self.path}: ADIOS2 variable {name!r} has shape {var.shape()}, expected [{count}]")
        self._check_declared(name, count, np.dtype(dtype).itemsize)
        out = np.empty(count, dtype=dtype)
        if count:
            var.set_selection([[0], [count]])
            self._stream.engine.get(var, out, self._mode)
        return out

    def _read(self, index: int) -> Data:
        if getattr(self, "_stream", None) is None or self._pid != os.getpid():
            self._connect()
        where = f"{self.path}: sample {index}"
        buffers = []
        for j, (_, dtype, _) in enumerate(self._keys):
            start, end = int(self._offsets[j][index]), int(self._offsets[j][index + 1])
            buf = np.empty(end - start, dtype=storage_dtype(dtype))
            if end > start:
                var = self._variable(f"k{j}/data")
                var.set_selection([[start], [end - start]])
                self._stream.engine.get(var, buf, self._mode)
            buffers.append(buf)
        fields: dict[str, Any] = {}
        for j, (name, dtype, _) in enumerate(self._keys):
            buf = buffers[j]
            if zlib.crc32(buf) != int(self._crcs[index, j]):
                raise ContainerError(f"{where}: attribute {name!r} is corrupted (checksum mismatch)")
            if dtype == JSON_KIND:
                fields[name] = loads_json(buf.tobytes().decode("utf-8", errors="replace"), name, where)
                continue
            shapes = self._shapes[j]  # None exactly when ndim is 0
            shape = tuple(int(s) for s in shapes[index]) if shapes is not None else ()
            fields[name] = torch.from_numpy(buf).view(DTYPES[dtype]).reshape(shape)
        return build_data(fields)

    def close(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None and getattr(self, "_pid", None) == os.getpid():
            stream.close()
        self._stream = self._io = self._adios = self._vars = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_adios", "_io", "_stream", "_vars"):
            state[key] = None
        return state
