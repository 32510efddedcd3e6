"""The conversion cache's entries: records, lookup by exact name, validity, publication.

An entry ``<cache>/<file name>.<digest16>/`` holds the prepared container and ``record.json``
(fingerprint, schema, isolated atoms, counts, the source's resolved path). An entry is usable
only when its record reads completely and its container says it was written for the entry's
digest; it appears by one rename of a finished private folder (:func:`publish`), so readers see
it complete or not at all, and a conversion that loses a race uses the winner's entry.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..containers import ContainerDataset, open_dataset
from ..errors import ContainerError, DataError, SchemaError
from ..schema import Schema
from .atomic import atomic_write
from .download import sha256_file

RECORD = "record.json"
VERIFY = ("auto", "hash")
"""How a conversion tells that its file is unchanged (:func:`file_identity`)."""
HASH_ALWAYS_BELOW = 64 << 20
"""Files smaller than this (64 MiB, about 0.1 s of SHA-256 from the page cache) are hashed at every
conversion call, whatever ``verify`` says."""

_RECORD_KEYS = {"digest": str, "fingerprint": dict, "schema": dict, "isolated_atoms": list}
_OPTIONAL_KEYS = {"path": str, "mtime_ns": int, "created": (int, float)}


def read_record(entry: Path) -> dict[str, Any] | None:
    """The entry's record, or ``None`` when it is missing, not JSON or lacks a key the cache
    reads (such an entry is never used: the conversion builds a new one in its place)."""
    try:
        record = json.loads((entry / RECORD).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or any(not isinstance(record.get(k), t) for k, t in _RECORD_KEYS.items()):
        return None
    if any(k in record and not isinstance(record[k], t) for k, t in _OPTIONAL_KEYS.items()):
        return None
    if not isinstance(record["fingerprint"].get("file", {}), dict):
        return None
    try:
        Schema.from_dict(record["schema"])
        [(int(z), float(e)) for z, e in record["isolated_atoms"]]
    except (SchemaError, TypeError, ValueError):
        return None
    return record


def records(cache: Path, name: str) -> list[tuple[Path, dict[str, Any]]]:
    """Readable records of the entries of file ``name`` (``<name>.<digest16>`` exactly: the name
    is matched literally, so ``a.xyz`` never sees ``a.xyz.old``'s entries), newest first."""
    out = []
    for entry in cache.glob(f"{glob.escape(name)}.*"):
        stem, _, digest = entry.name.rpartition(".")
        if stem != name or len(digest) != 16:
            continue
        record = read_record(entry)
        if record is not None:
            out.append((entry, record))
    return sorted(out, key=lambda er: er[1].get("created", 0.0), reverse=True)


def open_entry(data_path: Path, digest: str, log: Callable[[str], None] | None) -> ContainerDataset | None:
    """The entry's container when it opens and says it was written for ``digest``, else ``None``
    (a folder copied or swapped in from another file, or damaged: rebuilt)."""
    if not data_path.exists():
        return None
    try:
        dataset = open_dataset(data_path)
    except (ContainerError, DataError, SchemaError) as exc:
        if log is not None:
            log(f"{data_path}: the cached container does not open ({exc}); rebuilding it")
        return None
    if (dataset.metadata or {}).get("digest") != digest:
        if log is not None:
            log(f"{data_path}: the cached container was written for another source or settings; rebuilding it")
        return None
    return dataset


def publish(built: Path, entry: Path, digest: str, data_name: str) -> Path:
    """Rename the finished folder ``built`` to ``entry``. When a valid entry is there already (a
    conversion that ran at the same time won), ``built`` is dropped and the winner's is used; an
    invalid one (interrupted, damaged, a container of another source) is moved aside first."""
    for _ in range(3):
        try:
            os.rename(built, entry)
            return entry
        except OSError:
            existing = read_record(entry)
            if (
                existing is not None
                and existing.get("digest") == digest
                and open_entry(entry / data_name, digest, None) is not None
            ):
                shutil.rmtree(built, ignore_errors=True)
                return entry
            trash = entry.with_name(f".{entry.name}.stale-{os.getpid()}-{time.monotonic_ns()}")
            try:
                os.rename(entry, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(built, ignore_errors=True)
    raise ContainerError(f"{entry}: cannot publish the converted data there (another process keeps replacing it)")


def file_identity(path: Path, known: list[tuple[Path, dict[str, Any]]], verify: str = "auto") -> dict[str, Any]:
    """``{name, size, sha256, mtime_ns}`` of the file at ``path``.

    The SHA-256 is computed from the content, except under ``verify="auto"`` for a file of at
    least :data:`HASH_ALWAYS_BELOW` bytes whose resolved path, size and modification time match
    a record: that record's SHA-256 is reused (an edit that keeps the size and restores the time
    goes unseen; ``verify="hash"`` sees it).
    """
    st = path.stat()
    resolved = str(path.resolve())
    trust_time = verify == "auto" and st.st_size >= HASH_ALWAYS_BELOW
    for _, record in known if trust_time else ():
        f = record["fingerprint"].get("file", {})
        if (
            record.get("path") == resolved
            and f.get("size") == st.st_size
            and record.get("mtime_ns") == st.st_mtime_ns
            and f.get("sha256")
        ):
            return {"name": path.name, "size": st.st_size, "sha256": f["sha256"], "mtime_ns": st.st_mtime_ns}
    return {"name": path.name, "size": st.st_size, "sha256": sha256_file(path), "mtime_ns": st.st_mtime_ns}


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words."""
    out = []
    if old.get("file", {}).get("sha256") != new["file"]["sha256"]:
        out.append("the file changed")
    if old.get("cutoff") != new["cutoff"]:
        out.append(f"cutoff {old.get('cutoff')} -> {new['cutoff']}")
    labels = {"source": "frame selection or label keys", "schema": "schema", "container": "container format"}
    for key, words in labels.items():
        if old.get(key) != new[key]:
            out.append(f"{words} changed")
    if old.get("converter") != new["converter"]:
        out.append(f"converter version {old.get('converter')} -> {new['converter']}")
    return out or ["unknown change"]


def atomic_json(path: Path, value: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(value, indent=1, sort_keys=True).encode())
