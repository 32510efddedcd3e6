"""Convert a file ASE reads into a prepared dataset container once, and reuse it while valid.

:func:`convert_source` streams the frames of an :class:`~hydragnn.data.io.ase_source.AseSource`,
prepares each against the schema (given or inferred), builds its edges at ``cutoff`` and writes
them to a container (``.pt`` directory or ADIOS2) in a cache folder, next to a record of the
*fingerprint* that decided them: the file's size and SHA-256, the frame selection, the label
keys, the schema, the cutoff and the converter version. The next call with the same
fingerprint opens the container and rebuilds nothing; any change builds a new entry and says
what changed. Entries made from an older content of the same file are removed.

Cache layout (default ``<file's folder>/.hydragnn_cache``, else ``converted/`` in the user cache,
``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``, when that folder is not writable)::

    <cache>/<file name>.<digest16>/data.pt|data.bp    the prepared samples (with edges)
    <cache>/<file name>.<digest16>/record.json        fingerprint, schema, isolated atoms, counts

Each conversion builds in a hidden folder of its own (``.<file name>.<digest16>.part-*``) and
publishes it with one rename, ``record.json`` written before: two runs converting one file at
once both succeed (the later drops its copy and uses the entry published first), and an entry is
complete or absent. Entries are found by the file's exact name (``train[1].xyz`` and ``a.xyz.old``
are names, not patterns); the removal of entries made from an older content of the file only
touches entries recorded for the same resolved path, so runs whose files share a name and a
``cache_dir`` keep each other's entries. A cache hit needs a readable record and a container
whose stored digest is the entry's; anything else is rebuilt and the log says why. A file below
64 MiB is hashed at every call; a larger one only when its size or modification time differ from
a record, or always with ``verify="hash"``. Converting warns (once per file) about atoms closer
than :data:`COINCIDENT_ANGSTROM`, found on the edges it builds anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..containers import ContainerDataset, open_dataset
from ..errors import ContainerError, DataError, DataWarning
from ..schema import Schema
from ..threads import spinning_notice
from .ase_source import AseSource
from .conversion_cache import RECORD, VERIFY, atomic_json, changes, file_identity, open_entry, publish, records
from .conversion_samples import COINCIDENT_ANGSTROM, write_samples
from .download import default_cache_dir as user_cache_dir

__all__ = ["COINCIDENT_ANGSTROM", "CONVERTER_VERSION", "ConvertedSource", "convert_source", "default_cache_dir"]

CONVERTER_VERSION = 1
"""Bumped whenever the samples a conversion writes change meaning; old entries are rebuilt."""
_SUFFIX = {"pt": "pt", "adios": "bp"}


@dataclass(frozen=True)
class ConvertedSource:
    """The prepared container of a source.

    Attributes:
        dataset: the opened container (prepared samples with ``edge_index``).
        schema: the schema of the samples (the given one, or the one inferred).
        isolated_atoms: ``(Z, energy)`` of every ``IsolatedAtom`` frame.
        record: the entry's record (fingerprint, counts, skipped config types, timings).
        cached: whether the container was reused.
        seconds: wall time of this call.
        entry: the cache entry folder.
    """

    dataset: ContainerDataset
    schema: Schema
    isolated_atoms: tuple[tuple[int, float], ...]
    record: dict[str, Any]
    cached: bool
    seconds: float
    entry: Path


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def default_cache_dir(path: Path) -> Path:
    """``<folder of path>/.hydragnn_cache`` when writable, else ``converted/`` in the user cache
    (``$HYDRAGNN_CACHE`` or ``~/.cache/hydragnn``, the download cache's folder)."""
    beside = path.resolve().parent / ".hydragnn_cache"
    if _writable(beside):
        return beside
    return user_cache_dir() / "converted"


def convert_source(
    source: AseSource,
    *,
    cutoff: float,
    schema: Schema | None = None,
    cache_dir: str | os.PathLike | None = None,
    container_format: str = "pt",
    verify: str = "auto",
    log: Callable[[str], None] | None = None,
) -> ConvertedSource:
    """The prepared container of ``source`` (built now, or reused from the cache).

    Args:
        source: the file, frame selection and label keys.
        cutoff: radius of the edges built for every sample, Å.
        schema: the schema to prepare against; ``None`` infers it from the first sample frame
            (see :mod:`hydragnn.data.io.ase_source`).
        cache_dir: the cache folder (default :func:`default_cache_dir`).
        container_format: ``"pt"`` or ``"adios"`` (needs ``hydra-data[adios]``).
        verify: ``"auto"`` hashes files below :data:`~hydragnn.data.io.conversion_cache.HASH_ALWAYS_BELOW`
            (64 MiB), trusts size and modification time above; ``"hash"`` hashes every file.
        log: one line per event (cache hit, rebuild and why, summary, progress); ``None``: silent.

    Returns:
        A :class:`ConvertedSource`.

    Raises:
        ContainerError: unreadable file or frame, unwritable cache.
        SchemaError: missing or malformed labels (naming the file, the frame and the labels it has).
        DataError: no frame selected, or an unknown ``verify``.

    Warns:
        DuplicateKeyWarning: a key repeated in an extxyz comment line (once per file and key).
        CoincidentAtomsWarning: atoms closer than :data:`COINCIDENT_ANGSTROM` (once per file).
        DataWarning: OpenMP busy-waits on threads nobody chose (torch loaded first in a script;
            once per process: :func:`~hydragnn.data.threads.spinning_notice`).
    """
    t0 = time.perf_counter()
    _check_arguments(source.path, cutoff, container_format, verify)
    path = source.path
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(path)
    known = records(cache, path.name)
    identity = file_identity(path, known, verify)
    fingerprint, digest = _fingerprint(source, schema, float(cutoff), container_format, identity)
    entry = cache / f"{path.name}.{digest[:16]}"
    data_path = entry / f"data.{_SUFFIX[container_format]}"
    record = next((r for e, r in known if e == entry and r.get("digest") == digest), None)
    hit = _from_cache(path, entry, data_path, digest, record, identity, t0, log) if record is not None else None
    if hit is not None:
        return hit

    if log is not None:
        _log_rebuild(log, path, entry, record, known, digest, fingerprint)
    if not _writable(cache):
        raise ContainerError(f"{cache}: the cache folder is not writable (set the cache folder to a writable place)")
    if (advice := spinning_notice()) is not None:  # a script of one's own that loaded torch first
        warnings.warn(f"hydragnn.data: converting {path.name}: {advice}", DataWarning, stacklevel=2)
    final_entry, final_data = entry, data_path
    # built in a folder of this call's own, published by one rename: a conversion running at the
    # same time (another run, another node on a shared file system) never sees a half-written entry
    entry = Path(tempfile.mkdtemp(prefix=f".{path.name}.{digest[:16]}.part-", dir=cache))
    resolved, isolated, counts, skipped = write_samples(
        source, schema, float(cutoff), container_format, entry / final_data.name, digest, log
    )
    seconds = time.perf_counter() - t0
    record = {
        "digest": digest,
        "fingerprint": fingerprint,
        "mtime_ns": identity["mtime_ns"],
        "created": time.time(),
        "schema": resolved.to_dict(),
        "isolated_atoms": [[z, e] for z, e in isolated],
        "frames": counts["frames"],
        "samples": counts["samples"],
        "skipped_config_types": skipped,
        "seconds": seconds,
        "path": str(path.resolve()),
    }
    entry = _publish(entry, final_entry, final_data.name, record, known, identity)
    data_path = final_data
    if log is not None:
        log(_built_line(path, counts["samples"], seconds, len(isolated), skipped))
    return ConvertedSource(
        dataset=open_dataset(data_path),
        schema=resolved,
        isolated_atoms=tuple(isolated),
        record=record,
        cached=False,
        seconds=seconds,
        entry=entry,
    )


def _fingerprint(
    source: AseSource, schema: Schema | None, cutoff: float, container_format: str, identity: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``(fingerprint, sha256 digest)`` of everything a converted entry depends on: converter
    version, file identity, frame selection and keys, schema, cutoff and container format."""
    fingerprint = {
        "converter": CONVERTER_VERSION,
        "file": {k: identity[k] for k in ("name", "size", "sha256")},
        "source": source.fingerprint(),
        "schema": schema.to_dict() if schema is not None else None,
        "cutoff": cutoff,
        "container": container_format,
    }
    return fingerprint, hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


def _built_line(path: Path, samples: int, seconds: float, isolated: int, skipped: Any) -> str:
    """The log line of a finished conversion."""
    return (
        f"{path}: {samples} samples prepared in {seconds:.1f} s ({1000 * seconds / max(samples, 1):.1f} ms per structure)"
        + (f", {isolated} isolated atoms" if isolated else "")
        + (f", skipped by config type: {skipped}" if skipped else "")
    )


def _check_arguments(path: Path, cutoff: object, container_format: str, verify: str) -> None:
    """Refuse an unknown container format or ``verify``, a bad cutoff, a missing file."""
    if container_format not in _SUFFIX:
        raise ContainerError(f"container_format: expected one of {sorted(_SUFFIX)}, found {container_format!r}")
    if not (isinstance(cutoff, (int, float)) and cutoff > 0):
        raise DataError(f"cutoff: expected a number > 0, found {cutoff!r}")
    if verify not in VERIFY:
        raise DataError(f"verify: expected one of {list(VERIFY)}, found {verify!r}")
    if not path.is_file():
        raise ContainerError(f"{path}: no such file")


def _log_rebuild(
    log: Callable[[str], None],
    path: Path,
    entry: Path,
    record: dict[str, Any] | None,
    known: list[tuple[Path, dict[str, Any]]],
    digest: str,
    fingerprint: dict[str, Any],
) -> None:
    """Say why the file is converted: a damaged entry, what changed since the last one, or new."""
    if record is None and (entry / RECORD).exists():
        log(f"{entry / RECORD}: unreadable or incomplete; rebuilding the entry")
    previous = [r for _, r in known if r.get("digest") != digest]
    why = f"rebuilding ({'; '.join(changes(previous[0]['fingerprint'], fingerprint))})" if previous else "converting"
    log(f"{path}: {why} into {entry}")


def _publish(
    built: Path,
    final: Path,
    data_name: str,
    record: dict[str, Any],
    known: list[tuple[Path, dict[str, Any]]],
    identity: dict[str, Any],
) -> Path:
    """Write ``record`` into the folder ``built``, publish it as ``final`` (one rename) and remove
    the entries made from another content of this very file; returns the published entry."""
    atomic_json(built / RECORD, record)
    entry = publish(built, final, record["digest"], data_name)
    for old_entry, old in known:
        same_file = old.get("path") == record["path"]
        if old_entry != entry and same_file and old["fingerprint"].get("file", {}).get("sha256") != identity["sha256"]:
            shutil.rmtree(old_entry, ignore_errors=True)
    return entry


def _from_cache(
    path: Path,
    entry: Path,
    data_path: Path,
    digest: str,
    record: dict[str, Any],
    identity: dict[str, Any],
    t0: float,
    log: Callable[[str], None] | None,
) -> ConvertedSource | None:
    """The cached entry of ``record`` opened, or ``None`` when its container does not open."""
    dataset = open_entry(data_path, digest, log)
    if dataset is None:
        return None
    if record.get("mtime_ns") != identity["mtime_ns"]:
        atomic_json(entry / RECORD, {**record, "mtime_ns": identity["mtime_ns"]})
    seconds = time.perf_counter() - t0
    if log is not None:
        log(f"{path}: {len(dataset)} prepared samples from the cache {entry} ({seconds:.2f} s)")
    return ConvertedSource(
        dataset=dataset,
        schema=Schema.from_dict(record["schema"]),
        isolated_atoms=tuple((int(z), float(e)) for z, e in record["isolated_atoms"]),
        record=record,
        cached=True,
        seconds=seconds,
        entry=entry,
    )
